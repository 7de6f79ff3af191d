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

from flask import current_app, has_request_context
from kombu.exceptions import KombuError, OperationalError
from redis.exceptions import RedisError
from sqlalchemy import case
from sqlalchemy.orm.attributes import set_committed_value

from chattts_farm.audio_store import StoredAudio
from chattts_farm.contract import PROGRESS_STATE, TASK_NAME, Blend, SpeakerSample, SynthesisRequest
from web import access, admission, backends, batch_status, callbacks, delivery
from web.access import limits
from web.errors import ApiError
from web.job_status import describe
from web.models import ApiKey, Batch, CallbackState, Job, JobStatus, Voice, db, utcnow

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
# As much of a task's arguments as its message shows (Flower): Celery's own bound.
KWARGS_REPR_CHARS = 1024
# Task states read in one round trip when many jobs are brought up to date (a batch's items).
STATES_READ_AT_ONCE = 1000


def submit(request: SynthesisRequest, voice: Voice | None = None) -> Job:
    """Admit the job past the queue's caps, reserve its expected audio against its key's quota, record the
    job, then enqueue it under the same id. A job refused by a cap or the quota leaves nothing behind; a
    queue that cannot be reached fails the job."""
    return submit_together([(request, voice)])[0]


def submit_together(
    requests: list[tuple[SynthesisRequest, Voice | None]],
    in_batch: Batch | None = None,
    custom_ids: list[str | None] | None = None,
) -> list[Job]:
    """Submit jobs all or none (as :func:`submit` does one): when the caps or the quota refuse one, none
    is recorded or sent. Sent back to back, they reach a worker together and share its GPU passes.
    A batch's items (``in_batch``, recorded with them) keep their places in it and ``custom_ids``.

    Thousands at once cost a few round trips, not thousands: one admission and one reservation for them
    all, the rows inserted together, the messages sent in one pipeline."""
    api_key = access.current_key()
    limits.count_jobs(api_key, len(requests))
    created_at = utcnow()
    custom_ids = custom_ids or [None] * len(requests)
    batch = [
        _new_job(request, voice, api_key, created_at, in_batch, item, custom_id)
        for item, ((request, voice), custom_id) in enumerate(zip(requests, custom_ids, strict=True))
    ]
    ids = [job.id for job in batch]
    admission.admit(api_key, *ids)
    try:
        limits.reserve_audio(
            api_key,
            created_at,
            {job.id: request.expected_seconds for job, (request, _) in zip(batch, requests, strict=True)},
        )
    except ApiError:
        admission.release(api_key, *ids)
        raise
    # Read before the commit, which expires every row: reading them after would load each again.
    messages = [(job.id, _task_arguments(job)) for job in batch]
    if in_batch is not None:
        db.session.add(in_batch)
        db.session.flush()  # the batch's row before its items', which name it
    db.session.add_all(batch)
    db.session.commit()
    try:
        _send_all(messages)
    # kombu raises OperationalError for the broker, BatchPublishError when a pipeline of messages failed
    # (which of them went out unknown).
    except (OperationalError, KombuError, RedisError) as error:
        logger.error("jobs %s, ... (%d) could not be enqueued: %s", ids[0], len(ids), error)
        _read_again(ids)
        _finish_all(batch, JobStatus.FAILED, f"the job queue could not be reached: {error}", dict.fromkeys(ids, 0.0))
        raise ApiError(503, "the job queue (Redis) could not be reached; the job was not started") from None
    admission.sent(api_key, *ids)
    logger.info("%d job(s) queued: %s, ...", len(ids), ids[0])
    return batch


def _new_job(
    request: SynthesisRequest,
    voice: Voice | None,
    api_key: ApiKey | None,
    created_at: datetime,
    in_batch: Batch | None = None,
    item: int | None = None,
    custom_id: str | None = None,
) -> Job:
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
        batch_id=in_batch.id if in_batch is not None else None,
        batch_item=item if in_batch is not None else None,
        custom_id=custom_id,
    )


def enqueue(job: Job) -> None:
    """Send the job's task under the job's own id, with the arguments its row records (so the
    reconciler sends a lost job again exactly as it was first sent), to its priority's queue
    (chattts_farm.celery_client routes it)."""
    _send_all([(job.id, _task_arguments(job))])


def _task_arguments(job: Job) -> dict[str, Any]:
    """The task's arguments as the job's row records them. Not its callback: the web calls that back
    itself, with the job's status as its API answers it (web.callbacks)."""
    voice = job.voice_mix or job.voice_sample or (job.voice_embedding if job.voice_seed is None else job.voice_seed)
    return {"text": job.text, "voice": voice, **job.parameters}


def _send_all(messages: list[tuple[str, dict[str, Any]]]) -> None:
    """Send tasks (job id, arguments) in one pipeline of messages, flushed once: thousands cost a round
    trip, not thousands (each message and its sent event are written together). Not retried message by
    message, which would declare each message's queue again, a round trip each: a pipeline is never
    retried anyway. The arguments' repr that Flower shows is Python's own, cut: Celery's careful one
    cost as much as the rest of a message."""
    sender = backends.current().sender
    with sender.producer_or_acquire() as producer, producer.batch(max_size=2 * len(messages)):
        for job_id, arguments in messages:
            sender.send_task(
                TASK_NAME,
                kwargs=arguments,
                task_id=job_id,
                producer=producer,
                retry=False,
                argsrepr="()",
                kwargsrepr=repr(arguments)[:KWARGS_REPR_CHARS],
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
    refresh_all([job])
    return job


def refresh_all(jobs: list[Job]) -> None:
    """Bring jobs up to date, as :func:`refresh` does each, their tasks' states read a thousand at a time
    (a batch's items). The jobs whose status moves are written first, each committed (which expires every
    row of the session), then all are read back in one query a thousand, then the others are shown their
    progress: not a query per job."""
    for job in jobs:
        if job.status in JobStatus.FINISHED:
            callbacks.settle(job)
    unfinished = [job for job in jobs if job.status not in JobStatus.FINISHED]
    seen = []
    for first in range(0, len(unfinished), STATES_READ_AT_ONCE):
        chunk = unfinished[first : first + STATES_READ_AT_ONCE]
        seen.extend(zip(chunk, _task_metas([job.id for job in chunk]), strict=True))
    moving = [(job, meta) for job, meta in seen if _STATUS_OF_STATE.get(meta["status"], job.status) != job.status]
    if moving:
        ids = [job.id for job in unfinished]
        for job, meta in moving:
            _catch_up(job, meta)
        _read_again(ids)
    for job, meta in seen:
        if job.status not in JobStatus.FINISHED:
            _catch_up(job, meta)


def _read_again(job_ids: list[str]) -> None:
    """Load the session's expired rows of these jobs again, a thousand a query (not one a job)."""
    for first in range(0, len(job_ids), STATES_READ_AT_ONCE):
        db.session.execute(db.select(Job).where(Job.id.in_(job_ids[first : first + STATES_READ_AT_ONCE]))).all()


def _task_metas(job_ids: list[str]) -> list[dict]:
    """The tasks' states and payloads, as Celery's ``get_task_meta`` reads each (one read of both: two
    reads race the task's end), in one round trip."""
    backend = backends.current().celery.backend
    stored = backend.mget([backend.get_key_for_task(job_id) for job_id in job_ids])
    return [backend.decode_result(value) if value else {"status": "PENDING", "result": None} for value in stored]


def _catch_up(job: Job, meta: dict) -> None:
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
        _finish(job, status, error="cancelled", charged_s=delivery.cancel_all([job.id])[0])
    else:
        progress = _progress(payload) if state == PROGRESS_STATE else None
        progress = job.progress if progress is None else progress
        if status != job.status:
            _move(job, status=status, progress=progress)
            db.session.commit()
        else:
            # Shown, not written: a poll does not write the row at every step of progress.
            set_committed_value(job, "progress", progress)


def cancel(job: Job) -> Job:
    """Revoke an unfinished job (queued or running): whoever listens to its stream hears nothing more, and
    its key is charged the audio they were sent before. A finished job is left as it is."""
    cancel_all([job])
    return job


def cancel_all(jobs: list[Job]) -> None:
    """Cancel each unfinished job as :func:`cancel` does one; thousands (a batch's items) in a few round
    trips: one revoke for them all, their messages taken out of the queues in one pass, one update."""
    refresh_all(jobs)
    unfinished = [job for job in jobs if job.status not in JobStatus.FINISHED]
    if not unfinished:
        return
    ids = [job.id for job in unfinished]
    sent_s = delivery.cancel_all(ids)
    backends.current().celery.control.revoke(ids)
    queued = [job.id for job in unfinished if job.status == JobStatus.QUEUED]
    if queued:  # no state yet: their messages may still wait in a queue list
        admission.withdraw(*queued)
    _finish_all(unfinished, JobStatus.CANCELLED, "cancelled", dict(zip(ids, sent_s, strict=True)))


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
        _ended([job], {job.id: outcome.get("duration_s", charged_s)})


def _finish_all(jobs: list[Job], status: str, error: str, charged_s: dict[str, float]) -> None:
    """Finish unfinished jobs with no outcome of their own, as :func:`_finish` does one, in one update
    (``charged_s``: job id -> the seconds its key is charged). The jobs' rows must be loaded: an expired
    one would be read again on its own."""
    ids = [job.id for job in jobs]
    moved_ids = set(
        db.session.execute(
            db.update(Job)
            .where(Job.id.in_(ids), Job.status.not_in(JobStatus.FINISHED))
            .values(
                status=status,
                error=error,
                finished_at=utcnow(),
                callback_state=case((Job.callback_url.is_not(None), CallbackState.PENDING), else_=None),
            )
            .returning(Job.id),
            execution_options={"synchronize_session": False},
        ).scalars()
    )
    db.session.commit()
    _read_again(ids)
    _ended([job for job in jobs if job.id in moved_ids], charged_s)


def _ended(jobs: list[Job], charged_s: dict[str, float]) -> None:
    """What follows jobs' ends, done by the request that ended them: each job's reservation settled (its
    charge in ``charged_s``), its place in the queue freed, its callback queued; and the end of the
    batches whose last items they were noticed."""
    limits.settle_audio([(job, charged_s[job.id]) for job in jobs])
    for api_key_id in {job.api_key_id for job in jobs}:
        api_key = db.session.get(ApiKey, api_key_id) if api_key_id is not None else None
        admission.release(api_key, *[job.id for job in jobs if job.api_key_id == api_key_id])
    for job in jobs:
        if job.callback_url is not None:
            call_back(job)
    for batch_id in {job.batch_id for job in jobs if job.batch_id is not None}:
        batch_status.notice_end(batch_id)


def call_back(job: Job) -> None:
    """Hand a finished job's status to its callback's delivery queue."""
    # The reconciler notices ends outside any request: its status's URLs are the paths a request's are.
    with nullcontext() if has_request_context() else current_app.test_request_context():
        body = json.dumps(describe(job))
    callbacks.send(job, body)


def watch_for_callbacks() -> None:
    """Notice the end of every unfinished job with a callback (nobody may be polling it), queue the
    callbacks still pending of finished jobs (their queue could not be reached as they ended), and keep
    in their rows the outcomes of those the workers have delivered or given up on."""
    unfinished = db.select(Job).where(Job.callback_url.is_not(None), Job.status.not_in(JobStatus.FINISHED))
    for job in db.session.execute(unfinished).scalars().all():
        refresh(job)
    for job in callbacks.pending(Job):
        call_back(job)
    callbacks.settle_queued(Job)


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
