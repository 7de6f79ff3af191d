"""The ASR gate's process beside the engine: segments' audio in, what was heard in it out.

Recognising a segment takes far longer than one engine step (pocketsphinx ~0.1 s a sentence on a
core, Whisper a forward pass of its own), so the pipeline hands each finished attempt over with
``submit`` and goes on stepping (it never waits for a verdict while the engine has work); ``collect``
gives the verdicts back on the engine's thread.

The recogniser runs in a process of its own, not on a thread of the engine's. Whisper's decoding is
a Python loop of small kernels, and on a thread it held the interpreter's lock that the engine's
thread needs between its launches: on an H200 the standard workload ran at 0.59 of its speed
without the gate (bench/asr_cost.py, 2026-12-03, py-spy: the listener's thread active 85% of the
run). The process takes every attempt waiting, up to ``max_batch``, hears them as one batch (Whisper
as one padded batch, pocketsphinx one after another), judges each against its text there too, and
sends the verdicts back. It is started, loaded and warmed up before the engine sizes its cache from
the device memory left, and ends with the engine's process (:mod:`worker.orphans`). If it dies, the
attempts it held come back unchecked (a recogniser's failure never fails a job) and another starts.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from worker.asr.text import error_rate, normalise
from worker.audio import SAMPLE_RATE
from worker.engine.segment import AsrCheck, Attempt, Segment

logger = logging.getLogger(__name__)

# Most attempts one batch takes (the process takes what is waiting, so a batch is this large only under
# load). Whisper's time goes to its token-by-token decoding loop, a step for a whole batch: on an H200
# beside the engine (bench/asr_cost.py --asr-batch 32,128,256, 1,024 jobs, the listener then a thread)
# the farm with the gate kept 40% of its throughput without it at 32, 65% at 128 and 73% at 256.
MAX_BATCH = 256
# Loading Whisper and warming it up on the GPU takes seconds; a process silent this long has hung.
START_TIMEOUT_S = 600.0


class Recogniser(Protocol):
    """What the listener is given (worker.asr.backends.Recogniser): picklable, loaded in its process."""

    def hears(self, text: str) -> bool: ...

    def load(self): ...


@dataclass
class Heard:
    """An attempt at a segment, back from the listener; ``check`` is None when the recogniser failed."""

    segment: Segment
    attempt: Attempt
    check: AsrCheck | None


@dataclass
class ListenerFigures:
    """What the listener has done since it started (benchmarks read them)."""

    batches: int = 0
    attempts: int = 0  # attempts recognised, in those batches
    busy_s: float = 0.0  # wall seconds spent recognising
    restarts: int = 0  # processes started again after one died


class ListenerFailed(RuntimeError):
    """The listener's process could not load its recogniser."""


class Listener:
    def __init__(self, recogniser: Recogniser, max_error_rate: float, max_batch: int = MAX_BATCH):
        self.recogniser = recogniser
        self.max_error_rate = max_error_rate
        self.max_batch = max_batch
        self.figures = ListenerFigures()
        # Spawned, not forked: the engine's process holds CUDA and many threads.
        self._context = multiprocessing.get_context("spawn")
        self._numbers = itertools.count()
        self._waiting: dict[int, tuple[Segment, Attempt]] = {}  # by number, submitted and not yet collected
        self._process = None
        self._start()

    @property
    def pid(self) -> int | None:
        """The listener's process, while one runs."""
        return self._process.pid if self._process is not None else None

    @property
    def pending(self) -> int:
        """Attempts submitted and not yet collected."""
        return len(self._waiting)

    def hears(self, text: str) -> bool:
        """Whether a segment of this text can be checked: something to say, in a language the recogniser knows."""
        return self._process is not None and bool(normalise(text)) and self.recogniser.hears(text)

    def submit(self, segment: Segment, attempt: Attempt) -> None:
        number = next(self._numbers)
        self._waiting[number] = (segment, attempt)
        self._asked.put((number, np.ascontiguousarray(attempt.samples, np.float32), segment.text))

    def collect(self, wait_s: float = 0.0) -> list[Heard]:
        """The attempts heard since the last call; with ``wait_s``, waits that long for the first."""
        batches = []
        try:
            batches.append(self._heard.get(timeout=wait_s) if wait_s else self._heard.get_nowait())
            while True:
                batches.append(self._heard.get_nowait())
        except queue.Empty:
            pass
        heard = []
        for checks, busy_s in batches:
            self.figures.batches += 1
            self.figures.attempts += len(checks)
            self.figures.busy_s += busy_s
            for number, check in checks:
                heard.append(Heard(*self._waiting.pop(number), check))
        unchecked = [
            f"{item.segment.index} of request {item.segment.request.request_id}" for item in heard if not item.check
        ]
        if unchecked:
            logger.warning("the recogniser failed on segments %s: they go unchecked", ", ".join(unchecked))
        if not batches and self._waiting and not self._process.is_alive():
            heard.extend(self._lost())
        return heard

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._process = None

    def _start(self) -> None:
        self._asked = self._context.Queue()
        self._heard = self._context.Queue()
        self._process = self._context.Process(
            target=_listen,
            args=(self.recogniser, self.max_error_rate, self.max_batch, os.getpid(), self._asked, self._heard),
            name="asr",
            daemon=True,
        )
        self._process.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                failure = self._heard.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._process.is_alive() or time.monotonic() > deadline:
                    failure = f"the listener's process ended or hung while loading (exit code {self._process.exitcode})"
                    break
        if failure is not None:
            self.close()
            raise ListenerFailed(f"the ASR gate's recogniser could not start: {failure}")

    def _lost(self) -> list[Heard]:
        """The attempts a dead process held, unchecked; and a new process for the next ones."""
        lost = [Heard(segment, attempt, None) for segment, attempt in self._waiting.values()]
        self._waiting.clear()
        logger.error(
            "the ASR gate's process died (exit code %s) with %d attempts: they go unchecked; starting another",
            self._process.exitcode,
            len(lost),
        )
        self.figures.restarts += 1
        try:
            self._start()
        except ListenerFailed:
            logger.exception("the ASR gate is off from now on")
        return lost


def _listen(recogniser: Recogniser, max_error_rate: float, max_batch: int, parent: int, asked, heard) -> None:
    """The listener's process: load, warm up, say so (None, or why it failed), then hear batches for good."""
    from worker.orphans import end_with

    end_with(parent)
    try:
        backend = recogniser.load()
        backend.warm_up(max_batch)
    except Exception as error:  # noqa: BLE001 - told to the engine's process, which raises it
        heard.put(f"{type(error).__name__}: {error}")
        return
    heard.put(None)
    # A reader drains the pipe as the engine's process writes it: a clip is larger than the pipe's
    # buffer, so the queue's next clip is written only once the last is read, and a batch taken
    # straight from it would be one or two clips long.
    arrived: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_drain, args=(asked, arrived), name="asr-reader", daemon=True).start()
    while True:
        batch = [arrived.get()]
        try:
            while len(batch) < max_batch:
                batch.append(arrived.get_nowait())
        except queue.Empty:
            pass
        started = time.perf_counter()
        checks = _check(backend, max_error_rate, batch)
        verdicts = [(number, check) for (number, _, _), check in zip(batch, checks, strict=True)]
        heard.put((verdicts, time.perf_counter() - started))


def _drain(asked, arrived: queue.SimpleQueue) -> None:
    while True:
        arrived.put(asked.get())


def _check(backend, max_error_rate: float, batch: list[tuple[int, np.ndarray, str]]) -> list[AsrCheck | None]:
    texts = [text for _, _, text in batch]
    try:
        heard = backend.transcribe_batch([samples for _, samples, _ in batch], SAMPLE_RATE, texts)
    except Exception:  # noqa: BLE001 - a recogniser's failure leaves the segments unchecked, never fails a job
        logger.exception("ASR failed on a batch of %d", len(batch))
        return [None] * len(batch)
    checks = []
    for said, heard_text in zip(texts, heard, strict=True):
        rate = error_rate(normalise(said), normalise(heard_text))
        checks.append(AsrCheck(backend.name, said, heard_text, round(rate, 4), rate <= max_error_rate))
    return checks
