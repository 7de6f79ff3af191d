"""The vocoder beside the engine: what the engine drew becomes audio on a CUDA stream of its own.

The vocoding step of the engine process's pipeline (worker.engine_process.pipeline), between the
engine and the request's result.

The engine's thread hands over :class:`Piece` s with ``submit``, which launches their decoding on the
vocoder's stream and returns at once; the GPU runs it between and beside the next decode steps, and
``collect`` takes back, in order, the pieces whose audio has landed in host memory, with the
quality gate's view of the whole rows. All of it runs on the engine's thread: a thread of its own
for the vocoder competed with the engine's thread for the GIL, and under load lost (its audio came
only when the engine ran dry).

A piece (worker.vocoder.piece) is a finished segment's whole row, or, for a segment that streams, the
frames drawn since its last piece with the context around them that makes their audio what the whole
row's would be.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

import numpy as np
import torch

from worker.engine.segment import Segment, SegmentQuality
from worker.vocoder import quality
from worker.vocoder.piece import Piece
from worker.vocoder.vocoder import LaunchedDecode, Vocoder


@dataclass
class Decoded:
    """Pieces back from the vocoder: each one's samples and, where asked, quality; or the error that stopped them."""

    pieces: list[Piece]
    samples: list[np.ndarray]
    qualities: list[SegmentQuality | None]
    seconds: float  # from launch to collection
    error: Exception | None = None


class Decoder:
    """Launches the decoding of pieces on its own CUDA stream (on the CPU: decodes them at once) and
    hands back those done, in the order they were handed over."""

    def __init__(self, vocoder: Vocoder, device: torch.device):
        self.vocoder = vocoder
        self.device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._launched: collections.deque[tuple[list[Piece], LaunchedDecode, float]] = collections.deque()

    @property
    def pending(self) -> int:
        """Pieces handed over and not yet collected."""
        return sum(len(pieces) for pieces, _, _ in self._launched)

    def submit(self, pieces: list[Piece]) -> None:
        """Launch the decoding of pieces whose hidden states the current stream has just written."""
        started = time.perf_counter()
        rows = [piece.hiddens for piece in pieces]
        if self._stream is None:
            launched = self.vocoder.launch(rows)
        else:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            for states in rows:
                # Allocated on the engine's stream: their memory must not be reused there while
                # this stream still reads it.
                states.record_stream(self._stream)
            with torch.cuda.stream(self._stream):
                launched = self.vocoder.launch(rows)
        self._launched.append((pieces, launched, started))

    def collect(self, wait: bool = False) -> list[Decoded]:
        """The pieces whose audio is there, in order; with ``wait``, waits for the oldest first."""
        batches = []
        while self._launched:
            pieces, launched, started = self._launched[0]
            if not (launched.ready() or (wait and not batches)):
                break
            self._launched.popleft()
            try:
                rows = launched.result()
            except Exception as error:  # noqa: BLE001 - the caller raises it where it can isolate it
                batches.append(Decoded(pieces, [], [], 0.0, error))
                continue
            samples = [self._kept(piece, row) for piece, row in zip(pieces, rows, strict=True)]
            qualities = [
                assess(piece.segment, row) if piece.assess else None for piece, row in zip(pieces, samples, strict=True)
            ]
            batches.append(Decoded(pieces, samples, qualities, time.perf_counter() - started))
        return batches

    def _kept(self, piece: Piece, row: np.ndarray) -> np.ndarray:
        per_frame = self.vocoder.samples_per_frame
        # A row's audio may be shorter than its frames' share (see Vocoder.decode): a last piece
        # keeps whatever its end gives.
        stop = None if piece.last else (piece.keep_to - piece.start) * per_frame
        return row[(piece.keep_from - piece.start) * per_frame : stop]


def assess(segment: Segment, samples: np.ndarray) -> SegmentQuality:
    """The quality gate's view of a segment's whole audio."""
    return judge(segment, quality.SampleStats.of(samples))


def judge(segment: Segment, stats: quality.SampleStats) -> SegmentQuality:
    """The quality gate's view of a segment whose audio adds up to ``stats``."""
    return quality.judge(stats, segment.output.tokens, segment.expected_tokens, segment.output.ended_by)
