"""The vocoder beside the engine: hidden states the engine drew are decoded on a thread of their own.

The engine's thread only launches work (CUDA graphs, a prefill) and waits for one small copy every
few steps; the vocoder's convolutions and the quality gate's checks would stop it for as long as they
run. Here they run on their own thread and, on a GPU, their own CUDA stream, so the GPU decodes the
next steps while the last ones become audio. The engine's thread hands over :class:`Piece` s with
``submit`` and takes the results back with ``collect``; it alone touches the segments' fields, so a
result becomes part of its segment only when collected.

A piece is a finished segment's whole row, or, for a segment that streams, the frames drawn since its
last piece with the context around them that makes their audio what the whole row's would be.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from worker import quality
from worker.engine.segment import Segment
from worker.engine.vocoder import Vocoder
from worker.queues import take_waiting

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Piece:
    """Hidden states of frames [start, start + len(hiddens)) of a segment, to be decoded into the audio of
    frames [keep_from, ...): to the row's end when ``last``, else up to ``keep_to``.

    Frames left of ``keep_from`` are context only: a kept frame's audio reads the frames within the
    vocoder's receptive field, so the piece starts that far before it (or at the row's start).
    """

    segment: Segment
    hiddens: torch.Tensor  # (frames, gpt width)
    start: int
    keep_from: int
    keep_to: int
    last: bool  # the piece ends where the segment ends
    assess: bool  # run the quality gate on the audio (a whole row's piece)

    @classmethod
    def whole(cls, segment: Segment) -> Piece:
        frames = segment.output.hiddens.shape[0]
        return cls(segment, segment.output.hiddens, 0, 0, frames, last=True, assess=True)


@dataclass
class Decoded:
    """Pieces back from the vocoder: each one's samples and, where asked, quality; or the error that stopped them."""

    pieces: list[Piece]
    samples: list[np.ndarray]
    qualities: list[quality.SegmentQuality | None]
    seconds: float  # how long the batch took
    error: Exception | None = None


class BackgroundDecoder:
    """Decodes and assesses pieces on its own thread; everything handed over waiting at once is one batch."""

    def __init__(self, vocoder: Vocoder, device: torch.device):
        self.vocoder = vocoder
        self.device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._todo: queue.SimpleQueue[tuple[list[Piece], torch.cuda.Event | None]] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[Decoded] = queue.SimpleQueue()
        self.pending = 0  # pieces handed over and not yet collected (read by the engine's thread only)
        threading.Thread(target=self._serve, name="vocoder", daemon=True).start()

    def submit(self, pieces: list[Piece]) -> None:
        """Hand over pieces whose hidden states the engine's stream has just written."""
        written = None
        if self._stream is not None:
            written = torch.cuda.Event()
            written.record(torch.cuda.current_stream(self.device))
        self.pending += len(pieces)
        self._todo.put((pieces, written))

    def collect(self, wait_s: float = 0.0) -> list[Decoded]:
        """The batches decoded since the last call; with ``wait_s`` and work pending, wait that long for one."""
        batches = []
        if wait_s and self.pending:
            try:
                batches.append(self._done.get(timeout=wait_s))
            except queue.Empty:
                return []
        while True:
            try:
                batches.append(self._done.get_nowait())
            except queue.Empty:
                break
        self.pending -= sum(len(batch.pieces) for batch in batches)
        return batches

    def _serve(self) -> None:
        while True:
            handed = take_waiting(self._todo)
            pieces = [piece for batch, _ in handed for piece in batch]
            started = time.perf_counter()
            try:
                samples, qualities = self._decode([event for _, event in handed], pieces)
            except Exception as error:  # noqa: BLE001 - the engine's thread raises it where it can isolate it
                logger.warning("decoding %d piece(s) failed: %r", len(pieces), error)
                self._done.put(Decoded(pieces, [], [], 0.0, error))
                continue
            self._done.put(Decoded(pieces, samples, qualities, time.perf_counter() - started))

    def _decode(
        self, written: list[torch.cuda.Event | None], pieces: list[Piece]
    ) -> tuple[list[np.ndarray], list[quality.SegmentQuality | None]]:
        rows = [piece.hiddens for piece in pieces]
        if self._stream is None:
            decoded = self.vocoder.decode(rows)
        else:
            for event in written:
                self._stream.wait_event(event)
            for states in rows:
                # Allocated on the engine's stream: their memory must not be reused there while
                # this stream still reads it.
                states.record_stream(self._stream)
            with torch.cuda.stream(self._stream):
                decoded = self.vocoder.decode(rows)
        samples = [self._kept(piece, row) for piece, row in zip(pieces, decoded, strict=True)]
        qualities = [
            assess(piece.segment, row) if piece.assess else None for piece, row in zip(pieces, samples, strict=True)
        ]
        return samples, qualities

    def _kept(self, piece: Piece, row: np.ndarray) -> np.ndarray:
        per_frame = self.vocoder.samples_per_frame
        # A row's audio may be shorter than its frames' share (see Vocoder.decode): a last piece
        # keeps whatever its end gives.
        stop = None if piece.last else (piece.keep_to - piece.start) * per_frame
        return row[(piece.keep_from - piece.start) * per_frame : stop]


def assess(segment: Segment, samples: np.ndarray) -> quality.SegmentQuality:
    """The quality gate's view of a segment's whole audio."""
    return quality.assess(samples, segment.output.tokens, segment.expected_tokens, segment.output.ended_by)
