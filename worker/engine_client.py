"""The Celery side's end of the engine process: starts it, hands it jobs, and starts it again when it dies.

Torch-free. The worker process holds one :class:`EngineClient`; each job's thread submits its request
and waits on the :class:`Job` it gets back. One receiver thread reads the channel (see worker.channel):
audio for streams, results, errors, and every running job's progress. When the engine process ends
(SIGKILL, a CUDA error, the OOM killer, the hard time limit), its end of the channel closes and the
receiver sees it at once: it starts a new engine process and hands it every job that was unfinished,
each with the seed it had (a stream sends only what had not gone out), up to ``engine_retries`` times
a job; past that the job fails with :class:`EngineLost`.

A GPU's other Celery processes (``CHATTTS_FARM_CELERY_PROCESSES``) start no engine: they connect to the
socket the first one's engine listens on, and when it dies they wait for the one their first process
starts again, then hand it their unfinished jobs the same way.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from chattts_farm.contract import (
    EngineLost,
    FarmError,
    JobCancelled,
    SynthesisFailed,
    SynthesisRequest,
    Voice,
    voice_argument,
)
from chattts_farm.settings import Settings
from worker.channel import Channel, error_from
from worker.engine_report import BatcherStats, GateCounts, MemoryGrowth, engine_stats
from worker.results import SynthesisResult

logger = logging.getLogger(__name__)

# A new engine process is tried this many times (waiting 1, 2, 4... s between) before the worker
# process gives up and exits, so that its supervisor starts it afresh and its jobs go elsewhere.
ENGINE_START_ATTEMPTS = 3
# A revoked job is looked for this often, and ended on this side at once.
REVOCATION_POLL_S = 0.1
# How long a question to the engine (a voice's embedding, a clip's speaker sample) may wait for its answer.
ASK_TIMEOUT_S = 60
# The worker ends with this code when no engine process can be started (see worker.supervisor).
EXIT_NO_ENGINE = 70
# How long a GPU's other Celery processes wait for the engine the first one starts (it loads and warms
# up the model; after a crash, its supervisor's backoff comes first) before they exit.
ENGINE_CONNECT_TIMEOUT_S = 600

# receives (segment index, float32 samples) of a streaming job, in order
Deliver = Callable[[int, np.ndarray], None]


@dataclass(eq=False)
class Job:
    """A job this worker holds: what its thread waits on and reads."""

    request: SynthesisRequest
    on_audio: Deliver | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None  # monotonic, in the engine process (one clock for the host)
    started_wall: float | None = None  # epoch seconds, reported to callers
    first_audio_at: float | None = None  # monotonic: when its first audio arrived here
    first_audio_sent_at: float | None = None  # monotonic: when the engine process handed it out
    finished: threading.Event = field(default_factory=threading.Event)
    outcome: SynthesisResult | FarmError | None = None
    progress: dict = field(default_factory=lambda: {"progress": 0.0, "segment": 0, "segments": 0})
    streamed: list[np.ndarray] = field(default_factory=list)  # of a stream: what came, its result's audio
    engine_deaths: int = 0  # engine processes that died while they ran it

    @property
    def sent_samples(self) -> int:
        """Of a stream: what has gone out, which a new engine process does not send again."""
        return sum(chunk.size for chunk in self.streamed)

    def finish(self, outcome: SynthesisResult | FarmError) -> None:
        self.outcome = outcome
        self.finished.set()


class EngineClient:
    def __init__(
        self, settings: Settings, name: str, *, is_revoked: Callable[[str], bool], log_level: int = logging.INFO
    ):
        self.settings = settings
        self.name = name  # gpu0, cpu1: the engine process is ``chattts-farm engine <name>``
        self.is_revoked = is_revoked
        self.log_level = log_level  # the engine process's, each time it is started
        self.model_info: dict = {}
        self.engine_pid: int | None = None
        self.restarts = 0  # engine processes started after the first
        self.stats = engine_stats(BatcherStats(), GateCounts(), MemoryGrowth())  # until the engine's first status
        self.gpu: dict | None = None
        self._jobs: dict[str, Job] = {}  # unfinished, by job id
        self._lock = threading.Lock()  # over _jobs and _channel: a job is sent once to each engine
        self._channel: Channel | None = None  # None while no engine process is up
        self._asks: dict[int, tuple[threading.Event, list]] = {}
        self._ask_numbers = itertools.count()
        self.stopping = False  # the worker is shutting down: an engine lost now is not waited for

    def start(self) -> None:
        """Start the engine process (or, in a GPU's other Celery processes, connect to the one the first
        started) and wait until its model is loaded and warm; raises the error that kept it from
        starting (ModelUnavailable naming what to set, say)."""
        if self.settings.engine_starter:
            self._start_engine()
        else:
            self._connect_engine()
        threading.Thread(target=self._watch_revocations, name="revocation-watch", daemon=True).start()

    def submit(self, request: SynthesisRequest, on_audio: Deliver | None = None) -> Job:
        # The seed is drawn here, not in the engine: a job run again by a new engine process must make
        # the same audio, or a stream would go on from where it was with another voice's samples.
        if request.seed is None:
            request = replace(request, seed=secrets.randbits(32))
        job = Job(request, on_audio=on_audio)
        with self._lock:
            self._jobs[request.request_id] = job
            if self._channel is not None:
                self._send_job(self._channel, job)
        return job

    def embedding(self, voice: Voice) -> str:
        """The speaker embedding a voice (a seed, a blend) names, from the engine's model."""
        return self._ask("embedding", voice_argument(voice), "embedding")

    def speaker_sample(self, pcm: bytes) -> str:
        """ChatTTS's speaker sample of a clip (samples as :data:`chattts_farm.contract.CLIP_PCM` says), from
        the engine's model (its DVAE's encoder)."""
        return self._ask("speaker_sample", pcm, "speaker sample")

    def _ask(self, question: str, argument, what: str):
        """The engine process's answer to a question about voices (see its ``_on_ask``)."""
        done, answer = threading.Event(), []
        number = next(self._ask_numbers)
        self._asks[number] = (done, answer)
        try:
            channel = self._channel
            if channel is None:
                raise SynthesisFailed("the engine process is starting again: ask again in a moment")
            try:
                channel.send("ask", ask=number, question=question, argument=argument)
            except OSError:
                raise SynthesisFailed("the engine process has died: ask again in a moment") from None
            if not done.wait(ASK_TIMEOUT_S):
                raise SynthesisFailed(f"the engine process gave no {what} within {ASK_TIMEOUT_S} s")
        finally:
            del self._asks[number]
        reply = answer[0]  # the first word: the answer, or that its engine died before it
        if "error" in reply:
            raise error_from(reply["error"])
        return reply["value"]

    def _start_engine(self) -> None:
        channel, theirs = Channel.pair()
        command = [
            sys.executable,
            "-m",
            self.settings.engine_module,
            str(theirs.fileno()),
            self.name,
            str(self.log_level),
        ]
        # A session of its own: a terminal's Ctrl-C (SIGINT to the foreground group) reaches the worker,
        # which shuts down warm; the engine ends when the worker's end of the channel closes.
        process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        try:
            message = channel.receive()
        except EOFError:
            message = {"kind": "ended"}
        if message["kind"] != "ready":
            code = process.wait()
            channel.close()
            if message["kind"] == "failed":
                raise error_from(message["error"])
            raise RuntimeError(f"the engine process exited (code {code}) before it was ready: its log says why")
        self._adopt(channel, message, process)

    def _connect_engine(self) -> None:
        """Connect to the engine process of this GPU that its first Celery process starts, waiting for it."""
        deadline = time.monotonic() + ENGINE_CONNECT_TIMEOUT_S
        while True:
            try:
                channel = Channel.connect(self.settings.engine_socket)
            except OSError:
                pass  # not listening (yet, or again)
            else:
                try:
                    ready = channel.receive()
                except EOFError:  # it was ending
                    channel.close()
                else:
                    self._adopt(channel, ready, process=None)
                    return
            if self.stopping or time.monotonic() > deadline:
                raise RuntimeError(
                    f"no engine process of {self.name} answered at {self.settings.engine_socket} within "
                    f"{ENGINE_CONNECT_TIMEOUT_S} s: the first Celery process of its GPU starts it, and its log says why"
                )
            time.sleep(0.5)

    def _adopt(self, channel: Channel, ready: dict, process: subprocess.Popen | None) -> None:
        """Take a ready engine's channel: every unfinished job goes to it, and a thread reads its messages."""
        self.model_info, self.engine_pid = ready["model"], ready["pid"]
        with self._lock:
            self._channel = channel
            for job in self._jobs.values():
                self._send_job(channel, job)
        threading.Thread(
            target=self._receive, args=(channel, process), name=f"engine-channel-{ready['pid']}", daemon=True
        ).start()
        logger.info("engine process %d of %s ready: %d job(s) handed to it", ready["pid"], self.name, len(self._jobs))

    def _send_job(self, channel: Channel, job: Job) -> None:
        # An OSError: the engine has died, and its receiver starts another, which gets every unfinished job.
        with contextlib.suppress(OSError):
            channel.send(
                "submit",
                job=job.request.request_id,
                # The engine synthesises; this side sends the job's callback.
                arguments=replace(job.request, callback_url=None).as_arguments(),
                stream=job.on_audio is not None,
                started_at=job.started_at,
                started_wall=job.started_wall,
                sent_samples=job.sent_samples,
            )

    def _receive(self, channel: Channel, process: subprocess.Popen | None) -> None:
        while True:
            try:
                message = channel.receive()
            except EOFError:
                break
            getattr(self, "_on_" + message.pop("kind"))(**message)
        self._engine_lost(channel, process)

    def _on_audio(self, job: str, segment: int, pcm: bytes) -> None:
        held = self._jobs.get(job)
        if held is None or held.on_audio is None:
            return
        samples = np.frombuffer(pcm, dtype=np.float32)
        if held.first_audio_at is None:
            held.first_audio_at = time.monotonic()
        held.streamed.append(samples)
        held.on_audio(segment, samples)

    def _on_finished(
        self,
        job: str,
        started_at,
        started_wall,
        first_audio_at=None,
        result: dict | None = None,
        error: dict | None = None,
    ):
        with self._lock:
            held = self._jobs.pop(job, None)
        if held is None:  # ended here already (revoked)
            return
        held.started_at, held.started_wall, held.first_audio_sent_at = started_at, started_wall, first_audio_at
        if error is not None:
            held.finish(error_from(error))
            return
        outcome = SynthesisResult.from_message(result)
        # A stream's audio came as it was drawn, across every engine process that ran it.
        held.finish(outcome if outcome.pieces is not None else outcome.with_streamed_audio(held.streamed))

    def _on_status(self, jobs: dict, stats: dict, **gpu_report) -> None:
        for job, (started_at, started_wall, progress) in jobs.items():
            held = self._jobs.get(job)
            if held is not None:
                held.started_at, held.started_wall, held.progress = started_at, started_wall, progress
        self.stats = stats
        if "gpu" in gpu_report:  # not in every status
            self.gpu = gpu_report["gpu"]

    def _on_answer(self, ask: int, **reply) -> None:
        waiting = self._asks.get(ask)
        if waiting is not None:
            waiting[1].append(reply)
            waiting[0].set()

    def _engine_lost(self, channel: Channel, process: subprocess.Popen | None) -> None:
        # Only the Celery process that started the engine knows how it ended.
        code = process.wait() if process is not None else "unknown here"
        channel.close()
        for done, answer in list(self._asks.values()):
            answer.append({"error": {"type": "SynthesisFailed", "args": ["the engine process died; ask again"]}})
            done.set()
        with self._lock:
            self._channel = None
            lost = list(self._jobs.values())
            for job in lost:
                job.engine_deaths += 1
                if job.engine_deaths > self.settings.engine_retries:
                    del self._jobs[job.request.request_id]
                    job.finish(
                        EngineLost(
                            f"the engine process died {job.engine_deaths} times while it ran job "
                            f"{job.request.request_id} (last exit code {code}); CHATTTS_FARM_ENGINE_RETRIES "
                            f"allows {self.settings.engine_retries} runs again"
                        )
                    )
        logger.error(
            "the engine process %d of %s ended (exit code %s) with %d job(s) unfinished: %s",
            self.engine_pid,
            self.name,
            code,
            len(lost),
            "starting another" if process is not None else "waiting for the one its first Celery process starts",
        )
        if process is None:
            try:
                self._connect_engine()
            except RuntimeError:
                logger.critical("no engine process of %s answers: exiting; this worker's jobs go elsewhere", self.name)
                os._exit(EXIT_NO_ENGINE)
            self.restarts += 1
            return
        for attempt in range(ENGINE_START_ATTEMPTS):
            try:
                self._start_engine()
            except Exception:  # noqa: BLE001 - tried again, then the worker exits
                logger.exception(
                    "engine process %d of %d for %s failed to start", attempt + 1, ENGINE_START_ATTEMPTS, self.name
                )
                time.sleep(2**attempt)
                continue
            self.restarts += 1
            return
        logger.critical("no engine process of %s starts: exiting so the supervisor restarts this worker", self.name)
        os._exit(EXIT_NO_ENGINE)

    def _watch_revocations(self) -> None:
        """End revoked jobs here at once (their threads return), and tell the engine to drop them."""
        while True:
            time.sleep(REVOCATION_POLL_S)
            with self._lock:
                revoked = [job for job_id, job in self._jobs.items() if self.is_revoked(job_id)]
                for job in revoked:
                    del self._jobs[job.request.request_id]
                channel = self._channel
            for job in revoked:
                job.finish(JobCancelled(f"job {job.request.request_id} was revoked"))
                if channel is not None:
                    with contextlib.suppress(OSError):  # a dead engine drops it anyway
                        channel.send("cancel", job=job.request.request_id)
