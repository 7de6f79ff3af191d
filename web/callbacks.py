"""A job's callback as the web sees it: handed to the workers' delivery queue once, as the job ends, and
its delivery read back from what they record.

The web notices a job's end (web.jobs, in a request or in the reconciler's round) and is the one to
write its status, the same JSON as ``GET /api/jobs/<id>``; a worker, which has no database, delivers it
(the ``chattts.deliver_callback`` task: signed, retried with backoff, each attempt recorded in Redis
under the job's id). The job's row says whether the delivery is still to be queued (``pending``: the
reconciler queues it if the request that finished the job could not), in the workers' hands
(``queued``), or over (``delivered``, ``failed``: then the row keeps the attempts, which Redis forgets).
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from chattts_farm import redis_keys
from chattts_farm.callbacks import CALLBACK_QUEUE, DELIVERY_TASK_NAME
from web import backends
from web.models import CallbackState, Job, db, utcnow

logger = logging.getLogger(__name__)

# A delivery pending for longer than this was not queued by the request that finished its job.
PENDING_GRACE = timedelta(seconds=10)


def send(job: Job, body: str) -> None:
    """Hand a finished job's status (``body``, JSON) to the delivery queue. A delivery that cannot be
    queued stays pending, for the reconciler."""
    try:
        backends.current().celery.send_task(
            DELIVERY_TASK_NAME,
            kwargs={"url": job.callback_url, "body": body, "record_id": job.id},
            queue=CALLBACK_QUEUE,
        )
    except (OperationalError, RedisError, RuntimeError) as error:
        logger.error("job %s: its callback could not be queued (the reconciler tries again): %s", job.id, error)
        return
    db.session.execute(
        db.update(Job)
        .where(Job.id == job.id, Job.callback_state == CallbackState.PENDING)
        .values(callback_state=CallbackState.QUEUED),
        execution_options={"synchronize_session": False},
    )
    db.session.commit()
    logger.info("job %s: its callback to %s is queued", job.id, job.callback_url)


def pending() -> list[Job]:
    """Finished jobs whose callbacks were not queued when they ended."""
    query = db.select(Job).where(
        Job.callback_state == CallbackState.PENDING, Job.finished_at < utcnow() - PENDING_GRACE
    )
    return list(db.session.execute(query).scalars())


def settle(job: Job) -> None:
    """Keep the outcome of a delivery that is over in the job's row, with its attempts."""
    if job.callback_state != CallbackState.QUEUED:
        return
    attempts = _recorded_attempts(job)
    if not attempts or attempts[-1]["outcome"] not in CallbackState.OVER:
        return
    db.session.execute(
        db.update(Job)
        .where(Job.id == job.id, Job.callback_state == CallbackState.QUEUED)
        .values(callback_state=attempts[-1]["outcome"], callback_attempts=attempts),
        execution_options={"synchronize_session": False},
    )
    db.session.commit()


def delivery(job: Job) -> dict | None:
    """The callback's part of a job's status: ``url``, ``state`` (``waiting`` while the job runs, then
    ``pending``, ``queued``, ``retrying``, ``delivered`` or ``failed``) and its ``attempts`` so far."""
    if job.callback_url is None:
        return None
    state, attempts = job.callback_state or "waiting", job.callback_attempts or []
    if state == CallbackState.QUEUED:
        attempts = _recorded_attempts(job)
        state = attempts[-1]["outcome"] if attempts else state
    return {"url": job.callback_url, "state": state, "attempts": attempts}


def _recorded_attempts(job: Job) -> list[dict]:
    """The attempts the workers recorded; none while Redis cannot be read (the job's status still answers)."""
    try:
        return [json.loads(raw) for raw in backends.current().redis.lrange(redis_keys.callback_attempts(job.id), 0, -1)]
    except RedisError as error:
        logger.warning("job %s: its callback's attempts could not be read: %s", job.id, error)
        return []
