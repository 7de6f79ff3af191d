"""The vocoder beside the engine: segments the engine finished are decoded on a thread of their own.

The engine's thread only launches work (CUDA graphs, a prefill) and waits for one small copy every
few steps; the vocoder's convolutions and the quality gate's checks would stop it for as long as they
run. Here they run on their own thread and, on a GPU, their own CUDA stream, so the GPU decodes the
next steps while the last segments become audio. The engine's thread hands segments over with
``submit`` and takes the results back with ``collect``; it alone touches the segments' fields, so a
result becomes part of its segment only when collected.
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

logger = logging.getLogger(__name__)


@dataclass
class Decoded:
    """One batch of segments back from the vocoder: their samples and quality, or the error that stopped it."""

    segments: list[Segment]
    samples: list[np.ndarray]
    qualities: list[quality.SegmentQuality]
    seconds: float  # how long the batch took
    error: Exception | None = None


class BackgroundDecoder:
    """Decodes and assesses finished segments on its own thread; everything handed over waiting at
    once is decoded as one batch."""

    def __init__(self, vocoder: Vocoder, device: torch.device):
        self.vocoder = vocoder
        self.device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._todo: queue.SimpleQueue[tuple[list[Segment], torch.cuda.Event | None]] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[Decoded] = queue.SimpleQueue()
        self.pending = 0  # segments handed over and not yet collected (read by the engine's thread only)
        threading.Thread(target=self._serve, name="vocoder", daemon=True).start()

    def submit(self, segments: list[Segment]) -> None:
        """Hand over segments whose output the engine's stream has just written."""
        written = None
        if self._stream is not None:
            written = torch.cuda.Event()
            written.record(torch.cuda.current_stream(self.device))
        self.pending += len(segments)
        self._todo.put((segments, written))

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
        self.pending -= sum(len(batch.segments) for batch in batches)
        return batches

    def _serve(self) -> None:
        while True:
            handed = [self._todo.get()]
            while True:
                try:
                    handed.append(self._todo.get_nowait())
                except queue.Empty:
                    break
            segments = [segment for batch, _ in handed for segment in batch]
            started = time.perf_counter()
            try:
                samples, qualities = self._decode([event for _, event in handed], segments)
            except Exception as error:  # noqa: BLE001 - the engine's thread raises it where it can isolate it
                logger.warning("decoding %d segment(s) failed: %r", len(segments), error)
                self._done.put(Decoded(segments, [], [], 0.0, error))
                continue
            self._done.put(Decoded(segments, samples, qualities, time.perf_counter() - started))

    def _decode(
        self, written: list[torch.cuda.Event | None], segments: list[Segment]
    ) -> tuple[list[np.ndarray], list[quality.SegmentQuality]]:
        hiddens = [segment.output.hiddens for segment in segments]
        if self._stream is None:
            samples = self.vocoder.decode(hiddens)
        else:
            for event in written:
                self._stream.wait_event(event)
            for states in hiddens:
                # Allocated on the engine's stream: their memory must not be reused there while
                # this stream still reads it.
                states.record_stream(self._stream)
            with torch.cuda.stream(self._stream):
                samples = self.vocoder.decode(hiddens)
        qualities = [
            quality.assess(row, segment.output.tokens, segment.expected_tokens, segment.output.ended_by)
            for row, segment in zip(samples, segments, strict=True)
        ]
        return samples, qualities
