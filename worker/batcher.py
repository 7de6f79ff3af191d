"""Cross-request batching inside one worker process.

Celery runs each job in its own thread (the worker's threads pool, one thread per job the process
holds); every thread hands its request to the process's single :class:`Batcher` and waits. The
batcher owns the model and the GPU: it takes every job that is waiting when it becomes free (up to
``max_jobs_in_flight``), synthesises them in one :meth:`Synthesizer.synthesize` call, and hands each thread
its own result or error. One process, one model, one batch on the GPU at a time.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from chattts_farm.contract import JobCancelled, JobTimeout, SynthesisFailed, SynthesisRequest
from worker.synthesis import SynthesisResult, Synthesizer

logger = logging.getLogger(__name__)


@dataclass
class JobHandle:
    """What a worker holds for one job: its request, and what the job's thread waits on and reads."""

    request: SynthesisRequest
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None  # monotonic, for time limits
    started_wall: float | None = None  # epoch seconds, reported to callers
    finished: threading.Event = field(default_factory=threading.Event)
    outcome: SynthesisResult | Exception | None = None
    progress: dict = field(default_factory=lambda: {"progress": 0.0, "segment": 0, "segments": 0})

    def finish(self, outcome: SynthesisResult | Exception) -> None:
        self.outcome = outcome
        self.finished.set()


@dataclass
class BatcherStats:
    batches: int = 0
    jobs_done: int = 0
    current_batch: int = 0
    last_batch_size: int = 0


class Batcher:
    def __init__(
        self,
        synthesizer: Synthesizer,
        *,
        max_jobs: int,
        window_s: float,
        soft_limit_s: float,
        hard_limit_s: float,
        is_revoked: Callable[[str], bool],
    ):
        self.synthesizer = synthesizer
        self.max_jobs = max_jobs
        self.window_s = window_s
        self.soft_limit_s = soft_limit_s
        self.hard_limit_s = hard_limit_s
        self.is_revoked = is_revoked
        self.stats = BatcherStats()
        self._waiting: queue.Queue[JobHandle] = queue.Queue()
        self._batch_started: float | None = None
        self._thread = threading.Thread(target=self._serve, name="batcher", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="batcher-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._watchdog.start()

    def submit(self, request: SynthesisRequest) -> JobHandle:
        handle = JobHandle(request)
        self._waiting.put(handle)
        return handle

    def _serve(self) -> None:
        while True:
            batch = self._gather()
            self._run(batch)

    def _gather(self) -> list[JobHandle]:
        """Block for one job, then take whatever else arrives within the window, up to max_jobs."""
        batch = [self._waiting.get()]
        deadline = time.monotonic() + self.window_s
        while len(batch) < self.max_jobs:
            try:
                batch.append(self._waiting.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return batch

    def _run(self, batch: list[JobHandle]) -> None:
        live = []
        for handle in batch:
            if self.is_revoked(handle.request.request_id):
                handle.finish(self._stopped(handle, timed_out=False))
            else:
                live.append(handle)
        if not live:
            return
        started = time.monotonic()
        for handle in live:
            handle.started_at = started
            handle.started_wall = time.time()
        timed_out: set[int] = set()

        def cancelled() -> set[int]:
            now = time.monotonic()
            for index, handle in enumerate(live):
                if now - handle.started_at > self.soft_limit_s:
                    timed_out.add(index)
            stopped = timed_out | {i for i, handle in enumerate(live) if self.is_revoked(handle.request.request_id)}
            # A stopped job ends now, not when its batch does: its rows stop drawing, its mates go on.
            for index in stopped:
                if not live[index].finished.is_set():
                    live[index].finish(self._stopped(live[index], timed_out=index in timed_out))
            return stopped

        def on_progress(index: int, fraction: float, done: int, total: int) -> None:
            live[index].progress = {"progress": round(fraction, 3), "segment": done, "segments": total}

        self.stats.current_batch = len(live)
        self._batch_started = started
        logger.info("batch of %d job(s): %s", len(live), ", ".join(j.request.request_id for j in live))
        try:
            outcomes = self._synthesize_isolating(live, on_progress, cancelled)
        finally:
            self._batch_started = None
            self.stats.current_batch = 0
        for index, (handle, outcome) in enumerate(zip(live, outcomes, strict=True)):
            if not handle.finished.is_set():
                handle.finish(
                    self._stopped(handle, index in timed_out) if isinstance(outcome, JobCancelled) else outcome
                )
        self.stats.batches += 1
        self.stats.jobs_done += len(live)
        self.stats.last_batch_size = len(live)

    def _stopped(self, handle: JobHandle, timed_out: bool) -> JobCancelled | JobTimeout:
        job_id = handle.request.request_id
        if timed_out:
            return JobTimeout(f"job {job_id} ran past the soft time limit of {self.soft_limit_s:.0f} s and was stopped")
        return JobCancelled(f"job {job_id} was revoked")

    def _synthesize_isolating(self, handles: list[JobHandle], on_progress, cancelled) -> list:
        """Synthesise jobs together; when the batch fails, split it in halves and try each again.

        A CUDA out-of-memory error frees the cached memory first, so smaller batches fit. A job that
        fails alone (a poison job) gets its own error after at most log2(n) splits, and its batch
        mates complete.
        """
        try:
            return self.synthesizer.synthesize(
                [handle.request for handle in handles], on_progress=on_progress, cancelled=cancelled
            )
        except Exception as error:  # noqa: BLE001 - any failure of the batch is isolated below
            if len(handles) == 1:
                logger.error("job %s failed: %r", handles[0].request.request_id, error)
                return [SynthesisFailed(f"synthesis failed: {error!r}")]
            logger.warning("batch of %d job(s) failed (%r): splitting it", len(handles), error)
            _free_cuda_cache(error)
        half = len(handles) // 2
        outcomes = []
        for offset, part in ((0, handles[:half]), (half, handles[half:])):

            def part_progress(index, fraction, done, total, offset=offset):
                on_progress(offset + index, fraction, done, total)

            def part_cancelled(part=part, offset=offset):
                return {i - offset for i in cancelled() if offset <= i < offset + len(part)}

            outcomes.extend(self._synthesize_isolating(part, part_progress, part_cancelled))
        return outcomes

    def _watch(self) -> None:
        """End the process when a batch hangs past the hard limit: its supervisor starts a fresh one,
        and Redis hands the unacknowledged jobs out again."""
        while True:
            time.sleep(1.0)
            started = self._batch_started
            if started is not None and time.monotonic() - started > self.hard_limit_s:
                logger.critical(
                    "a batch has run for more than %.0f s (the hard time limit): exiting so the "
                    "supervisor restarts this worker",
                    self.hard_limit_s,
                )
                os._exit(70)


def _free_cuda_cache(error: Exception) -> None:
    import torch

    if isinstance(error, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
