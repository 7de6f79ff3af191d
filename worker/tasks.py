"""The Celery task bodies: thin adapters between Celery and the engine process (see worker.engine_client)."""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from dataclasses import asdict
from typing import Any

import redis
from celery.concurrency import get_implementation
from celery.exceptions import Ignore
from celery.signals import (
    task_postrun,
    task_received,
    task_revoked,
    worker_init,
    worker_ready,
    worker_shutting_down,
)
from celery.worker import state as worker_state
from kombu.exceptions import OperationalError

from chattts_farm.callbacks import CALLBACK_QUEUE, DELIVERY_TASK_NAME, CallbackPolicy
from chattts_farm.contract import (
    EMBEDDING_TASK_NAME,
    HEALTH_TASK_NAME,
    SPEAKER_SAMPLE_TASK_NAME,
    TASK_NAME,
    CallbackFailed,
    FarmError,
    InvalidRequest,
    JobCancelled,
    SynthesisRequest,
    clip_samples,
    parse_voice,
)
from worker import callbacks, runtime
from worker.celery_app import app, settings
from worker.interpreter import share_promptly, start_threads_ahead

logger = logging.getLogger(__name__)

# Running jobs report their progress this often (the contract promises at least once a second).
PROGRESS_EVERY_S = 0.5

# The jobs this process holds: job id -> (its handle, its Celery request), for the progress reporter.
_held: dict[str, tuple] = {}
_held_lock = threading.Lock()


@worker_init.connect
def _start_runtime(sender, **_) -> None:
    # The engine process batches across this process's job threads: forking pools would start an
    # engine (a model, a GPU's memory) per child and run one job per process.
    if get_implementation(sender.pool_cls).__module__ != "celery.concurrency.thread":
        raise RuntimeError(
            "chattts-farm workers batch jobs in one process: run them with `-P threads` (`chattts-farm worker` does)"
        )
    share_promptly()
    # Celery sets its logging up after this signal: done here first (Celery's own call then finds it
    # done), the runtime's start is logged too (the engine process ready, the worker's model). The engine
    # process is handed the worker's level: before, it read the logging module's, WARNING at this point.
    if hasattr(sender, "setup_logging"):  # a worker started by `celery worker`, not a test's WorkController
        sender.setup_logging()
    runtime.start(
        settings,
        sender.hostname,
        is_revoked=lambda job_id: job_id in worker_state.revoked,
        celery_app=app,
        log_level=sender.loglevel,
    )
    threading.Thread(target=_report_progress, name="progress-reporter", daemon=True).start()


@worker_ready.connect
def _start_the_job_threads(sender, **_) -> None:
    # A thread for every job this process may hold, before the first burst comes (see start_threads_ahead).
    start_threads_ahead(sender.pool.executor, sender.pool.limit)


@worker_shutting_down.connect
def _bound_the_shutdown(**_) -> None:
    runtime.watch_shutdown()


# Every message this process holds is noted as it comes and as its job returns (see worker.failover).
@task_received.connect
def _note_received(request, **_) -> None:
    runtime.current().held_messages.received(request.id, request.message.delivery_tag)


@task_postrun.connect
def _note_returned(task_id, **_) -> None:
    runtime.current().held_messages.returned(task_id)


@task_revoked.connect
def _note_revoked(request, **_) -> None:
    runtime.current().held_messages.returned(request.id)


# Errors of the farm's own kinds are the caller's to read: logged without a traceback. Its STARTED state
# is stored by the task itself, with the look at whether it has succeeded already (see worker.result_backend).
@app.task(bind=True, name=TASK_NAME, throws=(FarmError,), track_started=False)
def synthesize(self, **arguments) -> dict:
    received_at = time.time()
    held = runtime.current()
    job_id = self.request.id
    try:
        request = SynthesisRequest.from_arguments(
            arguments,
            max_text_chars=held.settings.max_text_chars,
            callbacks=CallbackPolicy.from_settings(held.settings),
            request_id=job_id,
        )
    except InvalidRequest as error:
        if arguments.get("stream") is True:  # its reader waits on the stream
            held.streams.failed(job_id, error)
        raise
    if not self.backend.start(self.request):
        # Delivered again after it succeeded (its acknowledgement was lost with a broker connection).
        logger.warning("job %s is delivered again but has succeeded already: not running it twice", job_id)
        raise Ignore()
    with _held_lock:
        running_here = _held.get(job_id)
        if running_here is None:
            if request.stream:
                held.streams.begin(job_id)
            on_audio = functools.partial(held.streams.audio, job_id) if request.stream else None
            handle = held.engine.submit(request, on_audio=on_audio)
            _held[job_id] = (handle, self.request)
    if running_here is not None:
        # Delivered again while it runs here: a broker reconnection hands unacknowledged messages
        # out again. The running one answers; this delivery only waits for it, to be acknowledged.
        logger.warning("job %s is delivered again while it runs here: not running it twice", job_id)
        running_here[0].finished.wait()
        raise Ignore()
    try:
        handle.finished.wait()  # the engine client always finishes a job (or the process ends)
    finally:
        with _held_lock:
            del _held[job_id]
    outcome = handle.outcome
    if isinstance(outcome, FarmError) and request.stream:
        held.streams.failed(job_id, outcome)
    if isinstance(outcome, JobCancelled):
        self.backend.mark_as_revoked(job_id, reason="revoked", request=self.request)
        _send_callback(request, "cancelled", error="cancelled")
        raise Ignore()
    if isinstance(outcome, Exception):
        _send_callback(request, "failed", error=str(outcome))
        raise outcome
    key = held.audio_store.key(job_id, request.format)
    held.audio_store.write(key, outcome.encoded_by(held.encoders))
    summary = outcome.summary()
    if handle.first_audio_at is not None:
        summary["timings"]["first_chunk_s"] = round(handle.first_audio_at - handle.started_at, 4)
    if handle.first_audio_sent_at is not None:
        # Of first_chunk_s, the engine's share: the rest is the hop from the engine process to this one.
        summary["timings"]["first_chunk_engine_s"] = round(handle.first_audio_sent_at - handle.started_at, 4)
    logger.info("job %s done: %.2f s of audio in a batch of %d", job_id, outcome.duration_s, outcome.batch_size)
    result = {
        **summary,
        "job_id": job_id,
        "audio_key": key,
        "audio_url": held.audio_store.url(key),
        "worker": held.hostname,
        "model": outcome.model["kind"],
        "model_info": outcome.model,
        "received_at": received_at,
        "started_at": handle.started_wall,
        "finished_at": time.time(),
    }
    if request.stream:
        held.streams.end(job_id, result)
    held.job_finished(handle, outcome.duration_s)
    _send_callback(request, "done", result=result)
    return result


def _send_callback(
    request: SynthesisRequest, status: str, error: str | None = None, result: dict | None = None
) -> None:
    """A Celery caller's job that named a callback_url has it called as it ends. (The web's jobs are sent
    without one: the web calls theirs, with the status its API answers.)"""
    if request.callback_url is None:
        return
    body = json.dumps({"id": request.request_id, "status": status, "error": error, "result": result})
    arguments = {"url": request.callback_url, "body": body, "record_id": request.request_id}
    try:
        app.send_task(DELIVERY_TASK_NAME, kwargs=arguments, queue=CALLBACK_QUEUE)
    except (OperationalError, redis.RedisError) as failure:  # the job's own outcome stands
        logger.error("job %s: its callback could not be queued: %s", request.request_id, failure)


# A failed delivery is the caller's to read in the record (redis_keys.callback_attempts): no traceback.
@app.task(bind=True, name=DELIVERY_TASK_NAME, throws=(CallbackFailed,))
def deliver_callback(self, url: str, body: str, record_id: str) -> dict:
    """POST ``body`` (a finished job's status, JSON) to ``url``, signed; again after a backoff while
    attempts fail, up to CALLBACK_ATTEMPTS. Between attempts the delivery waits in Redis, holding no thread."""
    attempt = callbacks.attempt_delivery(
        url, body, record_id, number=self.request.retries + 1, settings=settings, client=app.backend.client
    )
    if attempt.outcome == callbacks.RETRYING:
        raise self.retry(countdown=attempt.retry_in_s, max_retries=None)
    if attempt.outcome == callbacks.FAILED:
        raise CallbackFailed(f"the callback of {record_id} to {url} failed: {attempt.error}")
    return asdict(attempt)


def _report_progress() -> None:
    """Write the progress of every running job of this process, in one pipeline every PROGRESS_EVERY_S.

    One thread and one round trip for all of them: a thread per job waking to report its own made the
    worker's many job threads fight the engine's thread for the GIL.
    """
    backend = app.backend
    while True:
        time.sleep(PROGRESS_EVERY_S)
        with _held_lock:
            running = [(handle, request) for handle, request in _held.values() if handle.started_at is not None]
        if not running:
            continue
        pipeline = backend.client.pipeline(transaction=False)
        for handle, request in running:
            backend.report_progress(pipeline, request, handle.progress)
        try:
            pipeline.execute()
        except redis.RedisError as error:
            logger.warning("progress of %d job(s) not reported: %s", len(running), error)


@app.task(name=HEALTH_TASK_NAME)
def health() -> dict:
    return runtime.current().health()


@app.task(name=EMBEDDING_TASK_NAME, throws=(FarmError,))
def voice_embedding(seed: int | None = None, voice: Any = None) -> str:
    """The embedding a seed (or any voice: a blend's is its mix) names, for callers without torch (the web
    catalog stores it)."""
    if (seed is None) == (voice is None):
        raise InvalidRequest("voice", "give exactly one of seed or voice")
    if seed is not None:
        voice = parse_voice(seed, field="seed")
        if not isinstance(voice, int):
            raise InvalidRequest("seed", "must be an integer seed")
    return runtime.current().engine.embedding(parse_voice(voice))


@app.task(name=SPEAKER_SAMPLE_TASK_NAME, throws=(FarmError,))
def speaker_sample(audio: str) -> str:
    """ChatTTS's speaker sample (``spk_smp``) of a reference clip (``audio``: base64 of the clip's samples
    as chattts_farm.contract.CLIP_PCM says), for callers without torch (the web catalog stores it)."""
    return runtime.current().engine.speaker_sample(clip_samples(audio))
