"""Streaming: a request's audio leaves the worker while the engine still draws it.

After every engine step the pipeline (worker.engine_process.pipeline) cuts each running segment of a
streaming request: once enough of its newest frames are *stable* (the context they need to their right
has been drawn, so more frames no longer change their audio), those frames go to the vocoder as a
:class:`~worker.vocoder.piece.Piece` with the context on either side. Decoded pieces come back in the
order they were cut and are delivered in the text's order: a later segment's audio waits for the
segments before it, then follows the silence between them (the pause between segments, or an SSML
break's). Joined, a request's delivered audio is the audio it would have had unstreamed: each piece
decodes the frames its kept ones read. How many that is, the vocoder measures at load
(:meth:`~worker.vocoder.vocoder.Vocoder.measure_stream_context`): its receptive field bounds it (52
frames, 1.1 s, at full scale), but what a frame's audio reads above float rounding is far less (7
frames for the synthetic weights), and that is what the first chunk waits for.

So the delivered audio is the request's result, and the stream keeps none of it once delivered: the
receiver has it (worker.engine_client), and the quality gate judges each segment from its pieces as
they go. Only where the ASR gate is to hear a segment is its audio kept until it is complete. Kept to
the request's end, a level of 256 streams held ~250 MB of pieces in pinned host memory, which torch had
to make anew the first time, and joined them on the engine's thread.

The first piece of a segment is small, so the first sound comes early; each later one is twice the
size of the one before, up to a bound, so that a long text is decoded in few, large passes. A piece
takes more context on its left where the row has it, so that its length is a multiple of the
vocoder's window step: pieces then replay the vocoder's CUDA graphs with the rows' windows, where a
piece of any other length runs op by op on the engine's thread (on an H200 with 256 streams, py-spy
found that thread busier launching such pieces than launching the decode steps). A segment's first
pieces start at the row's start and cannot be aligned; their lengths are the same for every stream
(:func:`row_start_piece_frames`), and the vocoder captures graphs for them too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from worker.engine.engine import SYNC_EVERY
from worker.engine.segment import Segment
from worker.vocoder.piece import Piece
from worker.vocoder.quality import SampleStats
from worker.vocoder.vocoder import WINDOW_STEP_FRAMES

FIRST_CHUNK_S = 0.25
# A first chunk cut short to end with an engine round is never shorter than this.
SHORTEST_FIRST_CHUNK_S = 0.15
LARGEST_CHUNK_S = 2.0

# deliver(segment index, samples): the next float32 samples of a request's audio, in order, and the
# segment of its text they belong to (the silence before a segment belongs to it, that after the last to the last)
Deliver = Callable[[int, np.ndarray], None]


class RequestStream:
    """One streaming request's audio on its way out."""

    def __init__(
        self,
        segments: list[Segment],
        *,
        deliver: Deliver,
        silences: list[int],
        frames_per_second: float,
        context_frames: int,
        keep_audio: bool = False,
    ):
        self.segments = segments
        self.deliver = deliver
        self.silences = silences  # before each segment, and after the last (see worker.results.joined)
        self.context_frames = context_frames
        self.first_chunk_frames = first_chunk_frames(frames_per_second, context_frames)
        self.largest_chunk_frames = largest_chunk_frames(frames_per_second)
        self._cut_to = [0] * len(segments)  # per segment: the frames whose audio has been cut off
        self._cuts = [0] * len(segments)
        # Per segment: the frames drawn that its next piece waits for. The pipeline asks every running
        # segment after every engine round, on the engine's thread, and most have nothing to cut: 512 of
        # them took 0.36 ms a round working out each one's next piece, 0.11 ms with this (development
        # machine, the pipeline's loop over stand-ins for the engine's segments).
        self._next_cut_at = [self._next_piece(index)[2] for index in range(len(segments))]
        # Per segment: its decoded pieces not delivered yet (a segment before it is still drawn), what
        # the quality gate reads of all its pieces, and with ``keep_audio`` all its pieces.
        self._waiting: list[list[np.ndarray]] = [[] for _ in segments]
        self._stats = [SampleStats() for _ in segments]
        self._kept: list[list[np.ndarray]] | None = [[] for _ in segments] if keep_audio else None
        self._complete = [False] * len(segments)
        self._next_segment = 0  # the segment whose audio goes out now
        self._silence(0, silences[0])

    def cut(
        self, segment: Segment, drawn: int, hidden_states: Callable[[Segment, int, int], torch.Tensor]
    ) -> list[Piece]:
        """The next pieces of a running segment that has drawn ``drawn`` frames: as many as its stable
        frames fill. A piece's size is set by its place in the row, so the pieces of many streams have
        few lengths between them and share the vocoder's batches.

        ``hidden_states(segment, start, stop)`` copies the segment's hidden states of frames [start, stop).
        """
        index = segment.index
        pieces = []
        while drawn >= self._next_cut_at[index]:
            start, keep_to, stop = self._next_piece(index)
            keep_from = self._cut_to[index]
            pieces.append(
                Piece(segment, hidden_states(segment, start, stop), start, keep_from, keep_to, last=False, assess=False)
            )
            self._cut_to[index] = keep_to
            self._cuts[index] += 1
            self._next_cut_at[index] = self._next_piece(index)[2]
        return pieces

    def _next_piece(self, index: int) -> tuple[int, int, int]:
        """(start, keep_to, stop) of a segment's next piece: it can be cut once ``stop`` frames are drawn."""
        first, largest, context = self.first_chunk_frames, self.largest_chunk_frames, self.context_frames
        return next_piece(self._cut_to[index], self._cuts[index], first, largest, context)

    def last_piece(self, segment: Segment) -> Piece:
        """What is left of a segment the engine finished: the frames not yet cut, to its end."""
        hiddens = segment.output.hiddens
        keep_from = min(self._cut_to[segment.index], hiddens.shape[0])
        start = aligned_start(keep_from - self.context_frames, hiddens.shape[0])
        return Piece(segment, hiddens[start:], start, keep_from, hiddens.shape[0], last=True, assess=False)

    def take(self, piece: Piece, samples: np.ndarray) -> None:
        """A decoded piece: deliver every piece that is next in the text's order."""
        index = piece.segment.index
        self._stats[index].add(samples)
        if self._kept is not None:
            self._kept[index].append(samples)
        self._waiting[index].append(samples)
        self._complete[index] = piece.last
        while self._next_segment < len(self.segments):
            for ready in self._waiting[self._next_segment]:
                if ready.size:
                    self.deliver(self._next_segment, ready)
            self._waiting[self._next_segment] = []
            if not self._complete[self._next_segment]:
                return
            self._next_segment += 1
            self._silence(min(self._next_segment, len(self.segments) - 1), self.silences[self._next_segment])

    def _silence(self, segment: int, samples: int) -> None:
        if samples:
            self.deliver(segment, np.zeros(samples, dtype=np.float32))

    def stats(self, segment: Segment) -> SampleStats:
        """What the quality gate reads of a segment's audio so far (all of it, once its last piece is taken)."""
        return self._stats[segment.index]

    def samples(self, segment: Segment) -> np.ndarray | None:
        """A complete segment's audio, its pieces joined, where the stream keeps its audio; else None."""
        return None if self._kept is None else np.concatenate(self._kept[segment.index])

    def sizes(self) -> list[int]:
        """The samples of each segment's audio, silences apart."""
        return [stats.size for stats in self._stats]


def first_chunk_frames(frames_per_second: float, context_frames: int) -> int:
    """The frames of a segment's first piece: up to FIRST_CHUNK_S of audio, as many as a round of the
    engine leaves stable. The host learns of a segment's frames a round at a time (its prefill's, then
    SYNC_EVERY decode steps a round), and a piece is cut once its frames and their context are drawn: at
    full scale 0.25 s is 12 frames, which with 7 of context need 19 drawn, known after 25; 10 frames are
    cut a round earlier, after 17 (a round of 64 streams took 17-19 ms on an H200). Where that would
    leave less than SHORTEST_FIRST_CHUNK_S, the first piece is FIRST_CHUNK_S."""
    most = math.ceil(FIRST_CHUNK_S * frames_per_second)
    within_a_round = 1 + SYNC_EVERY * ((most + context_frames - 1) // SYNC_EVERY) - context_frames
    return within_a_round if within_a_round >= SHORTEST_FIRST_CHUNK_S * frames_per_second else most


def largest_chunk_frames(frames_per_second: float) -> int:
    """The most frames one piece keeps: LARGEST_CHUNK_S of audio."""
    return math.ceil(LARGEST_CHUNK_S * frames_per_second)


def next_piece(cut_to: int, cuts: int, first_chunk: int, largest_chunk: int, context: int) -> tuple[int, int, int]:
    """(start, keep_to, stop) of a segment's next piece once its first ``cut_to`` frames went out in ``cuts``
    pieces: each kept chunk twice the one before, from ``first_chunk`` frames up to ``largest_chunk``, with
    ``context`` frames on its right and at least as many on its left (see :func:`aligned_start`)."""
    keep_to = cut_to + min(first_chunk << cuts, largest_chunk)
    stop = keep_to + context
    return aligned_start(cut_to - context, stop), keep_to, stop


def row_start_piece_frames(frames_per_second: float, context_frames: int) -> list[int]:
    """The lengths of a segment's pieces that start at its row's start and so cannot take more context to
    reach a multiple of the window step (its first one or two): the same for every stream, so that the
    vocoder captures graphs for them too, and a burst of streams' first pieces does not run op by op on
    the thread that launches the decode steps."""
    first, largest = first_chunk_frames(frames_per_second, context_frames), largest_chunk_frames(frames_per_second)
    lengths, cut_to, cuts = [], 0, 0
    while True:
        start, keep_to, stop = next_piece(cut_to, cuts, first, largest, context_frames)
        if start > 0:
            return lengths
        if stop % WINDOW_STEP_FRAMES:
            lengths.append(stop)
        cut_to, cuts = keep_to, cuts + 1


def aligned_start(start: int, stop: int) -> int:
    """Where a piece ending at ``stop`` that needs frames from ``start`` on starts: further left, so that
    its length is a multiple of WINDOW_STEP_FRAMES, where the row has the frames; else at the row's start."""
    steps = math.ceil((stop - start) / WINDOW_STEP_FRAMES)
    return max(0, stop - steps * WINDOW_STEP_FRAMES)
