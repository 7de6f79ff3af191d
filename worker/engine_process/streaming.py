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

A stream's first piece is small, so the first sound comes early. After it, a piece is cut only when
the audio it adds is about to be wanted: once the stream's lead (the audio cut so far, in the text's
order, less what has played since its first piece went out, played as it arrives) falls below
LOW_WATER_S, the current segment's stable frames are cut, all of them. While the engine draws v times
faster than the audio plays, each piece is then about v times the one before (0.25 s, 1.5 s, 9 s at
6x), where pieces of a size set by their place in the row (doubling up to 2 s) cut a 10-s segment
into 8 whatever the engine's speed; each piece is one more the engine's thread cuts, launches and
sends, the worker's Celery side and Redis carry. A segment after the one playing is cut at its end,
when the engine hands it over whole, or once it is the one playing. Where the engine draws no faster
than the audio plays, pieces stay small and go out as soon as they are stable.

A piece takes its context on either side where the row has it; the vocoder pads it to its window step
(worker.vocoder.vocoder), so that pieces of any length replay its CUDA graphs with the rows' windows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch

from worker.audio import SAMPLE_RATE
from worker.engine.engine import SYNC_EVERY
from worker.engine.segment import Segment
from worker.vocoder.piece import Piece
from worker.vocoder.quality import SampleStats

FIRST_CHUNK_S = 0.25
# A first chunk cut short to end with an engine round is never shorter than this.
SHORTEST_FIRST_CHUNK_S = 0.15
# A piece is cut once the stream's lead falls below this: enough for a piece cut now to reach a client
# (the next round, the vocoder, the channel, the worker's Celery side, Redis) before the audio before it
# has played. At 256 streams on an H100 a first chunk took 181-238 ms at p95 from submit to client, its
# wait for the engine included. Chosen, not measured.
LOW_WATER_S = 0.5

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
        already_sent: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.segments = segments
        self.deliver = deliver
        self.silences = silences  # before each segment, and after the last (see worker.results.joined)
        self.frames_per_second = frames_per_second
        self.context_frames = context_frames
        self.first_chunk_frames = first_chunk_frames(frames_per_second, context_frames)
        self.clock = clock
        self._cut_to = [0] * len(segments)  # per segment: the frames whose audio has been cut off
        # When the stream's first audio went out (by ``clock``): it plays from then on. A stream run again
        # after its engine process died has a receiver waiting from the start.
        self._playing_since: float | None = clock() if already_sent else None
        # The samples of the segments before the one playing and of the silences before it, less those
        # that went out on an earlier run: a receiver that lost its stream's engine process has played
        # them, and waits for what follows.
        self._samples_before = silences[0] - already_sent
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
        """The next piece of a running segment that has drawn ``drawn`` frames, if one is wanted now (see
        the module's doc): the stream's first piece once its frames are stable, then the playing segment's
        stable frames once the stream's lead is low.

        ``hidden_states(segment, start, stop)`` copies the segment's hidden states of frames [start, stop).
        """
        index = segment.index
        if index != self._next_segment:  # its audio waits for the segments before it
            return []
        stable = drawn - self.context_frames
        keep_from = self._cut_to[index]
        if self._playing_since is None:  # nothing has gone out: only the stream's first piece is wanted
            if index or keep_from or stable < self.first_chunk_frames:
                return []
            keep_to = self.first_chunk_frames
        elif not self._wanted_now(keep_from, stable):
            return []
        else:
            keep_to = stable
        stop = keep_to + self.context_frames
        start = max(0, keep_from - self.context_frames)
        self._cut_to[index] = keep_to
        hiddens = hidden_states(segment, start, stop)
        return [Piece(segment, hiddens, start, keep_from, keep_to, last=False, assess=False)]

    def _wanted_now(self, keep_from: int, stable: int) -> bool:
        """Whether the playing segment's stable frames after ``keep_from`` are to go out now: enough of
        them for a piece, some past what went out on an earlier run, and the stream's lead low."""
        return (
            stable - keep_from >= self.first_chunk_frames
            and self._ends_at_s(stable) > 0
            and self.lead_s() < LOW_WATER_S
        )

    def lead_s(self) -> float:
        """Seconds of the stream's audio cut and not yet played (as played from its first piece on)."""
        return self._ends_at_s(self._cut_to[self._next_segment]) - (self.clock() - self._playing_since)

    def _ends_at_s(self, frames: int) -> float:
        """Where the playing segment's first ``frames`` frames end in the stream's audio, in seconds after
        what went out on an earlier run."""
        return self._samples_before / SAMPLE_RATE + frames / self.frames_per_second

    def last_piece(self, segment: Segment) -> Piece:
        """What is left of a segment the engine finished: the frames not yet cut, to its end."""
        hiddens = segment.output.hiddens
        keep_from = min(self._cut_to[segment.index], hiddens.shape[0])
        start = max(0, keep_from - self.context_frames)
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
                    if self._playing_since is None:
                        self._playing_since = self.clock()
            self._waiting[self._next_segment] = []
            if not self._complete[self._next_segment]:
                return
            self._samples_before += self._stats[self._next_segment].size + self.silences[self._next_segment + 1]
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
    """The frames of a stream's first piece, and the fewest any later one keeps but a segment's last:
    up to FIRST_CHUNK_S of audio, as many as a round of the engine leaves stable. The host learns of a
    segment's frames a round at a time (its prefill's, then SYNC_EVERY decode steps a round), and a piece
    is cut once its frames and their context are drawn: at full scale 0.25 s is 12 frames, which with 7
    of context need 19 drawn, known after 25; 10 frames are cut a round earlier, after 17 (a round of 64
    streams took 17-19 ms on an H200). Where that would leave less than SHORTEST_FIRST_CHUNK_S, the first
    piece is FIRST_CHUNK_S."""
    most = math.ceil(FIRST_CHUNK_S * frames_per_second)
    within_a_round = 1 + SYNC_EVERY * ((most + context_frames - 1) // SYNC_EVERY) - context_frames
    return within_a_round if within_a_round >= SHORTEST_FIRST_CHUNK_S * frames_per_second else most
