"""The ASR gate's thread beside the engine: segments' audio in, what was heard in it out.

Recognising a segment takes far longer than one engine step (pocketsphinx ~0.1 s a sentence on a
core, Whisper a forward pass of its own), so it must not run on the engine's thread: the pipeline
hands each finished attempt over with ``submit`` and goes on stepping (it never waits for a verdict
while the engine has work); the thread takes every attempt waiting, up to ``max_batch``, and hands
them to the recogniser as one batch (Whisper runs them as one padded batch, pocketsphinx one after
another), and ``collect`` gives the verdicts back on the engine's thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

from worker.asr.backends import Backend
from worker.asr.text import error_rate, normalise, says_something
from worker.audio import SAMPLE_RATE
from worker.engine.segment import AsrCheck, Attempt, Segment

logger = logging.getLogger(__name__)


@dataclass
class Heard:
    """An attempt at a segment, back from the listener; ``check`` is None when the recogniser failed."""

    segment: Segment
    attempt: Attempt
    check: AsrCheck | None


# Most attempts one batch takes (the thread takes what is waiting, so a batch is this large only under
# load). Whisper's time goes to its token-by-token decoding loop, a step for a whole batch: on an H200
# beside the engine (bench/asr_cost.py --asr-batch 32,128,256, 1,024 jobs) the farm with the gate kept
# 40% of its throughput without it at 32, 65% at 128 and 73% at 256. Whisper's decoder keeps buffers for
# this many rows from the start (worker/asr/greedy.py: 2,923 MiB in fp16 for tiny), out of the engine's cache.
MAX_BATCH = 256


@dataclass
class ListenerFigures:
    """What the listener has done since it started (benchmarks read them)."""

    batches: int = 0
    attempts: int = 0  # attempts recognised, in those batches
    busy_s: float = 0.0  # wall seconds spent recognising


class Listener:
    def __init__(self, backend: Backend, max_error_rate: float, max_batch: int = MAX_BATCH):
        self.backend = backend
        self.max_error_rate = max_error_rate
        self.max_batch = max_batch
        self.figures = ListenerFigures()
        self._asked: queue.SimpleQueue[tuple[Segment, Attempt]] = queue.SimpleQueue()
        self._heard: queue.SimpleQueue[Heard] = queue.SimpleQueue()
        self.pending = 0  # attempts submitted and not yet collected
        threading.Thread(target=self._listen, name="asr", daemon=True).start()

    def hears(self, text: str) -> bool:
        """Whether a segment of this text can be checked: something to say, in a language the backend knows."""
        return says_something(text) and self.backend.hears(text)

    def submit(self, segment: Segment, attempt: Attempt) -> None:
        self.pending += 1
        self._asked.put((segment, attempt))

    def collect(self, wait_s: float = 0.0) -> list[Heard]:
        """The attempts heard since the last call; with ``wait_s``, waits that long for the first."""
        heard = []
        try:
            heard.append(self._heard.get(timeout=wait_s) if wait_s else self._heard.get_nowait())
            while True:
                heard.append(self._heard.get_nowait())
        except queue.Empty:
            pass
        self.pending -= len(heard)
        return heard

    def _listen(self) -> None:
        while True:
            batch = [self._asked.get()]
            try:
                while len(batch) < self.max_batch:
                    batch.append(self._asked.get_nowait())
            except queue.Empty:
                pass
            started = time.perf_counter()
            try:
                checks = self._check(batch)
            except Exception:  # noqa: BLE001 - a recogniser's (or a verdict's) failure leaves the segments unchecked;
                # it never fails a job, nor stops this thread, whose attempts would then wait for ever.
                logger.exception(
                    "ASR failed on a batch of %d, segments %s",
                    len(batch),
                    ", ".join(f"{segment.index} of request {segment.request.request_id}" for segment, _ in batch),
                )
                checks = [None] * len(batch)
            self.figures.busy_s += time.perf_counter() - started
            self.figures.batches += 1
            self.figures.attempts += len(batch)
            for (segment, attempt), check in zip(batch, checks, strict=True):
                self._heard.put(Heard(segment, attempt, check))

    def _check(self, batch: list[tuple[Segment, Attempt]]) -> list[AsrCheck]:
        texts = [segment.text for segment, _ in batch]
        heard = self.backend.transcribe_batch([attempt.samples for _, attempt in batch], SAMPLE_RATE, texts)
        checks = []
        for said, heard_text in zip(texts, heard, strict=True):
            rate = error_rate(normalise(said), normalise(heard_text))
            checks.append(AsrCheck(self.backend.name, said, heard_text, round(rate, 4), rate <= self.max_error_rate))
        return checks
