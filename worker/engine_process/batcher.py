"""Cross-request batching in the engine process: the thread that drives the pipeline's synthesizer.

The engine process's channel (see worker.engine_process.main) hands every job that arrives to its single
:class:`Batcher`. The batcher owns the model and the GPU: it adds every job that arrives to the
synthesizer (a job that arrives while others run joins their running batch at the next engine step),
steps the synthesizer, and finishes each job's handle with its own result or error as soon as the job
is done.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from chattts_farm.contract import JobCancelled, JobTimeout, SynthesisFailed, SynthesisRequest
from worker.engine import device_waits
from worker.engine_process.pipeline import PROGRESS_INTERVAL_S, Synthesizer
from worker.engine_process.streaming import Deliver
from worker.engine_process.synthesis import Synthesis
from worker.engine_report import BatcherStats
from worker.results import SynthesisResult

logger = logging.getLogger(__name__)


@dataclass
class JobHandle:
    """What the engine process holds for one job, from its arrival to its outcome: its request, and what its
    waiter waits on and reads. Each time the job's request goes through the synthesizer (again, in
    isolation, after a failed step) is a :class:`~worker.engine_process.synthesis.Synthesis` of it."""

    request: SynthesisRequest
    # When it first started, on any run: monotonic (for time limits; one clock for every process of
    # a host) and epoch seconds (reported to callers).
    started_at: float | None = None
    started_wall: float | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    outcome: SynthesisResult | Exception | None = None
    progress: dict = field(default_factory=lambda: {"progress": 0.0, "segment": 0, "segments": 0})
    on_audio: Deliver | None = None  # for a job that streams: gets its audio, in order, as it is drawn
    on_finished: Callable[[JobHandle], None] | None = None
    first_audio_at: float | None = None  # monotonic: when this process handed out its first audio
    _sent: int = 0  # samples given to on_audio, on this run or (sent_samples) an earlier one
    _position: int = 0  # samples the current attempt has produced

    def finish(self, outcome: SynthesisResult | Exception) -> None:
        self.outcome = outcome
        self.finished.set()
        if self.on_finished is not None:
            self.on_finished(self)

    @property
    def sent_samples(self) -> int:
        """The samples of its audio that have gone out, on any run."""
        return self._sent

    @property
    def deliver(self) -> Deliver | None:
        """What the synthesizer streams this job's audio to."""
        return None if self.on_audio is None else self._deliver

    def restart_stream(self) -> None:
        """The job runs again (in isolation, with the seed it had): what went out already is not sent twice."""
        self._position = 0

    def _deliver(self, segment: int, samples: np.ndarray) -> None:
        fresh = samples[max(0, self._sent - self._position) :]
        self._position += samples.size
        if fresh.size:
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic()
            self._sent += fresh.size
            self.on_audio(segment, fresh)


class Batcher:
    def __init__(
        self,
        synthesizer: Synthesizer,
        *,
        soft_limit_s: float,
        hard_limit_s: float,
        is_revoked: Callable[[str], bool],
    ):
        self.synthesizer = synthesizer
        self.soft_limit_s = soft_limit_s
        self.hard_limit_s = hard_limit_s
        self.is_revoked = is_revoked
        self.stats = BatcherStats()
        self._arrived: queue.Queue[JobHandle] = queue.Queue()
        self._in_flight: dict[int, tuple[JobHandle, Synthesis]] = {}
        self._busy_since: float | None = None  # when the synthesizer call now running began
        self._last_progress = 0.0
        self._thread = threading.Thread(target=self._serve, name="batcher", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="batcher-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._watchdog.start()

    def submit(
        self,
        request: SynthesisRequest,
        on_audio: Deliver | None = None,
        *,
        on_finished: Callable[[JobHandle], None] | None = None,
        started_at: float | None = None,
        started_wall: float | None = None,
        sent_samples: int = 0,
    ) -> JobHandle:
        """Queue a job; one that ran before (in an engine process that died) keeps when it first started,
        and its stream skips the ``sent_samples`` that went out then."""
        handle = JobHandle(
            request,
            on_audio=on_audio,
            on_finished=on_finished,
            started_at=started_at,
            started_wall=started_wall,
            _sent=sent_samples,
        )
        self._arrived.put(handle)
        return handle

    def running(self) -> list[JobHandle]:
        """The jobs in the synthesizer now (from any thread)."""
        return [handle for handle, _ in list(self._in_flight.values())]

    def _serve(self) -> None:
        try:
            while True:
                self._add_arrivals(wait=not self._in_flight)
                self._stop_revoked_and_timed_out()
                if self._in_flight:
                    self._step()
        except BaseException:
            # Job threads wait on this thread without a timeout: without it the process must go, so
            # that its supervisor starts a fresh one and Redis hands the unacknowledged jobs out again.
            logger.critical("the batcher failed: exiting so the supervisor restarts this worker", exc_info=True)
            os._exit(70)

    def _add_arrivals(self, wait: bool) -> None:
        """Add the jobs that arrived to the synthesizer; with nothing in flight, wait for one first."""
        arrived = []
        if wait:
            arrived.append(self._arrived.get())
        while True:
            try:
                arrived.append(self._arrived.get_nowait())
            except queue.Empty:
                break
        live = []
        for handle in arrived:
            stopped = self._why_stopped(handle, time.monotonic())
            if stopped is not None:
                handle.finish(stopped)
            else:
                live.append(handle)
        if not live:
            return
        now, wall = time.monotonic(), time.time()
        for handle in live:
            if handle.started_at is None:
                handle.started_at, handle.started_wall = now, wall
        # Every job is in the Celery process's log already; here, on the engine's thread, only on request.
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("adding %d job(s): %s", len(live), ", ".join(handle.request.request_id for handle in live))
        added = self._call(
            lambda: self.synthesizer.add(
                [handle.request for handle in live],
                [handle.deliver for handle in live],
                [handle.sent_samples for handle in live],
            ),
            arriving=live,
        )
        if added is None:
            return
        for handle, entry in zip(live, added, strict=True):
            if isinstance(entry, Synthesis):
                # Pinned, so that a run in isolation after a failed step makes the same audio.
                handle.request = dataclasses.replace(handle.request, seed=entry.seed)
                self._in_flight[entry.number] = (handle, entry)
            else:
                handle.finish(entry)
        self.stats.current_batch = len(self._in_flight)

    def _step(self) -> None:
        finished = self._call(self.synthesizer.step)
        if finished is None:
            return
        self.stats.batches += 1
        for entry, outcome in finished:
            handle, _ = self._in_flight.pop(entry.number)
            handle.finish(outcome)
            self.stats.jobs_done += 1
            self.stats.last_batch_size = entry.shared_with
        self.stats.current_batch = len(self._in_flight)
        if time.monotonic() - self._last_progress >= PROGRESS_INTERVAL_S:
            self._last_progress = time.monotonic()
            for handle, entry in self._in_flight.values():
                fraction, done, total = self.synthesizer.progress(entry)
                handle.progress = {"progress": round(fraction, 3), "segment": done, "segments": total}

    def _stop_revoked_and_timed_out(self) -> None:
        """A stopped job ends now, not when its batch mates do: its segments leave the engine."""
        now = time.monotonic()
        for number, (handle, _) in list(self._in_flight.items()):
            stopped = self._why_stopped(handle, now)
            if stopped is not None:
                self.synthesizer.cancel(number)
                del self._in_flight[number]
                handle.finish(stopped)

    def _call(self, call, arriving: list[JobHandle] = ()):
        """Run one synthesizer call under the watchdog; when it fails, finish every job in isolation."""
        self._busy_since = time.monotonic()
        started, waited = time.perf_counter(), device_waits.waited_s()
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - any failure is isolated below
            handles = [handle for handle, _ in self._in_flight.values()] + list(arriving)
            logger.warning("a synthesis step with %d job(s) failed (%r): isolating them", len(handles), error)
            _free_cuda_cache(error)
            self.synthesizer.abandon()
            self._in_flight.clear()
            self._finish_isolating(handles)
            self.stats.current_batch = 0
            return None
        finally:
            self._busy_since = None
            self.stats.in_steps_s += time.perf_counter() - started
            self.stats.waiting_for_device_s += device_waits.waited_s() - waited

    def _finish_isolating(self, handles: list[JobHandle]) -> None:
        """Synthesise jobs together; when that fails, split them in halves and try each again.

        A CUDA out-of-memory error frees the cached memory first, so smaller batches fit. A job that
        fails alone (a poison job) gets its own error after at most log2(n) splits, and its batch
        mates complete.
        """
        live = [handle for handle in handles if not handle.finished.is_set()]
        if not live:
            return
        self._busy_since = time.monotonic()
        for handle in live:
            handle.restart_stream()
        try:
            outcomes = self.synthesizer.synthesize(
                [handle.request for handle in live],
                cancelled=lambda: self._stopped_among(live),
                on_audio=[handle.deliver for handle in live],
                already_sent=[handle.sent_samples for handle in live],
            )
        except Exception as error:  # noqa: BLE001 - split below
            self.synthesizer.abandon()
            _free_cuda_cache(error)
            if len(live) == 1:
                logger.error("job %s failed: %r", live[0].request.request_id, error)
                live[0].finish(SynthesisFailed(f"synthesis failed: {error!r}"))
                return
            half = len(live) // 2
            self._finish_isolating(live[:half])
            self._finish_isolating(live[half:])
            return
        for handle, outcome in zip(live, outcomes, strict=True):
            if not handle.finished.is_set():
                handle.finish(outcome)
                self.stats.jobs_done += 1

    def _stopped_among(self, handles: list[JobHandle]) -> set[int]:
        now = time.monotonic()
        stopped = set()
        for index, handle in enumerate(handles):
            why = self._why_stopped(handle, now)
            if why is not None:
                stopped.add(index)
                if not handle.finished.is_set():
                    handle.finish(why)
        return stopped

    def _why_stopped(self, handle: JobHandle, now: float) -> JobCancelled | JobTimeout | None:
        """Why a job must stop now (past the soft time limit once started, or revoked), or None."""
        job_id = handle.request.request_id
        if handle.started_at is not None and now - handle.started_at > self.soft_limit_s:
            return JobTimeout(f"job {job_id} ran past the soft time limit of {self.soft_limit_s:.0f} s and was stopped")
        if self.is_revoked(job_id):
            return JobCancelled(f"job {job_id} was revoked")
        return None

    def _watch(self) -> None:
        """End the process when one synthesizer call hangs past the hard limit: its supervisor starts
        a fresh one, and Redis hands the unacknowledged jobs out again."""
        while True:
            time.sleep(1.0)
            started = self._busy_since
            if started is not None and time.monotonic() - started > self.hard_limit_s:
                logger.critical(
                    "a synthesis step has run for more than %.0f s (the hard time limit): exiting so the "
                    "supervisor restarts this worker",
                    self.hard_limit_s,
                )
                os._exit(70)


def _free_cuda_cache(error: Exception) -> None:
    import torch

    if isinstance(error, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
