"""Jobs as the web app sees them: a database row written before the job is enqueued, kept in step
with the task's state in Celery."""

from __future__ import annotations

import json
import logging
import math
import uuid
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from celery.result import AsyncResult
from flask import current_app, has_request_context
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError
from sqlalchemy.orm.attributes import set_committed_value

from chattts_farm.audio_store import StoredAudio
from chattts_farm.contract import PROGRESS_STATE, TASK_NAME, Blend, SpeakerSample, SynthesisRequest
from web import access, admission, backends, callbacks
from web.access import limits
from web.delivery import Delivery
from web.errors import ApiError
from web.job_status import describe
from web.models import ApiKey, CallbackState, Job, JobStatus, Voice, db, utcnow

logger = logging.getLogger(__name__)

_STATUS_OF_STATE = {
    "PENDING": JobStatus.QUEUED,
    "RECEIVED": JobStatus.QUEUED,
    "RETRY": JobStatus.QUEUED,
    "STARTED": JobStatus.RUNNING,
    PROGRESS_STATE: JobStatus.RUNNING,
    "SUCCESS": JobStatus.DONE,
    "FAILURE": JobStatus.FAILED,
    "REVOKED": JobStatus.CANCELLED,
}
MALFORMED_RESULT = "the job's result in Redis is malformed: it is not what a farm worker writes"


def submit(request: SynthesisRequest, voice: Voice | None = None) -> Job:
    """Admit the job past the queue's caps, reserve its expected audio against its key's quota, record the
    job, then enqueue it under the same id. A job refused by a cap or the quota leaves nothing behind; a
    queue that cannot be reached fails the job."""
    return submit_together([(request, voice)])[0]


def submit_together(requests: list[tuple[SynthesisRequest, Voice | None]]) -> list[Job]:
    """Submit jobs all or none (as :func:`submit` does one): when the caps or the quota refuse one, none
    is recorded or sent. Sent back to back, they reach a worker together and share its GPU passes."""
    api_key = access.current_key()
    limits.count_jobs(api_key, len(requests))
    created_at = utcnow()
    batch = [_new_job(request, voice, api_key, created_at) for request, voice in requests]
    admitted: list[Job] = []
    reserved: list[Job] = []
    try:
        for job, (request, _) in zip(batch, requests, strict=True):
            admission.admit(api_key, job.id)
            admitted.append(job)
            limits.reserve_audio(api_key, job.id, job.created_at, request.expected_seconds)
            reserved.append(job)
    except ApiError:
        for job in reserved:
            limits.settle_audio(job, 0)
        for job in admitted:
            admission.release(api_key, job.id)
        raise
    db.session.add_all(batch)
    db.session.commit()
    for job in batch:
        try:
            enqueue(job)
        # kombu raises OperationalError for the broker; Celery's Redis result backend, which subscribes to
        # the job's result channel as it is sent, gives up with a RuntimeError after its own retries.
        except (OperationalError, RedisError, RuntimeError) as error:
            logger.error("job %s could not be enqueued: %s", job.id, error)
            for unsent in batch[batch.index(job) :]:
                _finish(unsent, JobStatus.FAILED, error=f"the job queue could not be reached: {error}")
            raise ApiError(503, "the job queue (Redis) could not be reached; the job was not started") from None
        admission.sent(api_key, job.id)
        logger.info("job %s queued", job.id)
    return batch


def _new_job(request: SynthesisRequest, voice: Voice | None, api_key: ApiKey | None, created_at: datetime) -> Job:
    arguments = request.as_arguments()
    return Job(
        id=str(uuid.uuid4()),
        created_at=created_at,
        text=request.text,
        voice_id=voice.id if voice else None,
        voice_seed=request.voice_seed,
        voice_embedding=request.voice if isinstance(request.voice, str) else None,
        voice_mix=arguments["voice"] if isinstance(request.voice, Blend) else None,
        voice_sample=arguments["voice"] if isinstance(request.voice, SpeakerSample) else None,
        parameters={k: v for k, v in arguments.items() if k not in ("text", "voice", "callback_url")},
        callback_url=request.callback_url,
        format=request.format,
        status=JobStatus.QUEUED,
        api_key_id=api_key.id if api_key else None,
    )


def enqueue(job: Job) -> None:
    """Send the job's task under the job's own id, with the arguments its row records (so the
    reconciler sends a lost job again exactly as it was first sent), to its priority's queue
    (chattts_farm.celery_client routes it). Not its callback: the web calls
    that back itself, with the job's status as its API answers it (web.callbacks)."""
    voice = job.voice_mix or job.voice_sample or (job.voice_embedding if job.voice_seed is None else job.voice_seed)
    backends.current().celery.send_task(
        TASK_NAME, kwargs={"text": job.text, "voice": voice, **job.parameters}, task_id=job.id
    )


def visible(job_id: str) -> Job | None:
    """A job by id as the caller may see it: with keys on, only the key that submitted it does."""
    if not _is_job_id(job_id):  # PostgreSQL would refuse some (a NUL) rather than find nothing
        return None
    job = db.session.get(Job, job_id)
    key = access.current_key()
    return job if job is not None and (key is None or job.api_key_id == key.id) else None


def recent(limit: int, status: str | None = None) -> list[Job]:
    """The caller's newest jobs (all jobs with keys off), brought up to date, newest first."""
    query = db.select(Job).order_by(Job.created_at.desc()).limit(limit)
    key = access.current_key()
    if key is not None:
        query = query.where(Job.api_key_id == key.id)
    if status is not None:
        query = query.where(Job.status == status)
    return [refresh(job) for job in db.session.execute(query).scalars()]


def refresh(job: Job) -> Job:
    """Bring an unfinished job's row up to date with its task's state (a finished one's callback too)."""
    if job.status in JobStatus.FINISHED:
        callbacks.settle(job)
        return job
    # One read of the task's state and payload together: two reads race the task's end.
    meta = backends.current().celery.backend.get_task_meta(job.id)
    state, payload = meta["status"], meta.get("result")
    status = _STATUS_OF_STATE.get(state, job.status)
    if status == JobStatus.DONE:
        if _is_result_of(job, payload):
            _finish(
                job,
                status,
                duration_s=payload["duration_s"],
                audio_key=payload["audio_key"],
                voice_embedding=payload.get("voice_embedding") or job.voice_embedding,
                result={k: v for k, v in payload.items() if k != "voice_embedding"},
                progress=1.0,
            )
        else:
            # A worker writing to another audio store than this web's names another key: say which is expected.
            expected = backends.current().audio.key(job.id, job.format)
            logger.error("job %s: %s (audio key expected: %s): %.200r", job.id, MALFORMED_RESULT, expected, payload)
            _finish(job, JobStatus.FAILED, error=MALFORMED_RESULT)
    elif status == JobStatus.FAILED:
        _finish(job, status, error=str(payload))
    elif status == JobStatus.CANCELLED:  # revoked by a Celery caller: its listeners stop, as at a DELETE
        _finish(job, status, error="cancelled", charged_s=Delivery(job.id).cancel())
    else:
        progress = _progress(payload) if state == PROGRESS_STATE else None
        progress = job.progress if progress is None else progress
        if status != job.status:
            _move(job, status=status, progress=progress)
            db.session.commit()
        else:
            # Shown, not written: a poll does not write the row at every step of progress.
            set_committed_value(job, "progress", progress)
    return job


def cancel(job: Job) -> Job:
    """Revoke an unfinished job (queued or running): whoever listens to its stream hears nothing more, and
    its key is charged the audio they were sent before. A finished job is left as it is."""
    refresh(job)
    if job.status not in JobStatus.FINISHED:
        sent_s = Delivery(job.id).cancel()
        AsyncResult(job.id, app=backends.current().celery).revoke()
        if job.status == JobStatus.QUEUED:  # no state yet: its message may still wait in a queue list
            admission.withdraw(job.id)
        _finish(job, JobStatus.CANCELLED, error="cancelled", charged_s=sent_s)
    return job


def open_audio(job: Job) -> StoredAudio:
    """The job's audio, opened in the audio store (close it when done); 409 while the job is not done,
    410 once the store no longer holds it."""
    refresh(job)
    if job.status != JobStatus.DONE:
        raise ApiError(409, f"job {job.id} is {job.status}, not done: it has no audio")
    stored = backends.current().audio.open(job.audio_key)
    if stored is None:
        raise ApiError(410, f"the audio of job {job.id} has expired")
    return stored


def _finish(job: Job, status: str, error: str | None = None, charged_s: float = 0.0, **outcome: Any) -> None:
    """Finish an unfinished job, then settle its reserved audio with its key's quota (a done job is
    charged its duration, a cancelled one ``charged_s``, the audio its listeners were sent; a failed one
    gives its reservation back) and free its key's place in the queue. Of the requests that see a
    job finish at once, only the one whose update moves the row settles it. The write is committed before
    Redis is called: no database lock is held across a network call. That request also hands the job's
    callback, if it has one, to the delivery queue: once per ending."""
    if job.callback_url is not None:
        outcome["callback_state"] = CallbackState.PENDING
    moved = _move(job, status=status, error=error, finished_at=utcnow(), **outcome)
    db.session.commit()
    if moved:
        limits.settle_audio(job, outcome.get("duration_s", charged_s))
        admission.release(db.session.get(ApiKey, job.api_key_id) if job.api_key_id is not None else None, job.id)
        if job.callback_url is not None:
            call_back(job)


def call_back(job: Job) -> None:
    """Hand a finished job's status to its callback's delivery queue."""
    # The reconciler notices ends outside any request: its status's URLs are the paths a request's are.
    with nullcontext() if has_request_context() else current_app.test_request_context():
        body = json.dumps(describe(job))
    callbacks.send(job, body)


def watch_for_callbacks() -> None:
    """Notice the end of every unfinished job with a callback (nobody may be polling it), and queue the
    callbacks still pending of finished jobs (their queue could not be reached as they ended)."""
    unfinished = db.select(Job).where(Job.callback_url.is_not(None), Job.status.not_in(JobStatus.FINISHED))
    for job in db.session.execute(unfinished).scalars().all():
        refresh(job)
    for job in callbacks.pending():
        call_back(job)


def _move(job: Job, **values: Any) -> bool:
    """Write ``values`` to the job's row if it is still unfinished; True when it was. A conditional
    update, so that of the requests (threads, web processes) that see a job finish at once exactly one
    finishes it, and a request acting on a stale state never moves a finished job back."""
    moved = db.session.execute(
        db.update(Job).where(Job.id == job.id, Job.status.not_in(JobStatus.FINISHED)).values(**values),
        execution_options={"synchronize_session": False},
    )
    return moved.rowcount == 1


def _is_job_id(text: str) -> bool:
    """Whether ``text`` is a job id as :func:`submit` makes them."""
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def _is_result_of(job: Job, payload: object) -> bool:
    """Whether ``payload`` is a farm worker's result for this job (anyone who can write to Redis can
    write a result; a malformed one must fail the job, not the request)."""
    return (
        isinstance(payload, dict)
        and _finite(payload.get("duration_s")) is not None
        and payload["duration_s"] >= 0
        and payload.get("audio_key") == backends.current().audio.key(job.id, job.format)
        and isinstance(payload.get("voice_embedding"), str | None)
    )


def _progress(payload: object) -> float | None:
    return _finite(payload.get("progress")) if isinstance(payload, dict) else None


def _finite(value: object) -> float | None:
    """``value`` as a float when it is a finite number (JSON booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
