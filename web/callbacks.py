"""A job's callback (or a batch's) as the web sees it: handed to the workers' delivery queue once, as the
job ends, and its delivery read back from what they record. A batch's works as a job's does, its status
the JSON of ``GET /api/batches/<id>``, sent when its last item ends (web.batches).

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
from web.models import CallbackState, CallsBack, db, utcnow

logger = logging.getLogger(__name__)

# A delivery pending for longer than this was not queued by the request that finished its job.
PENDING_GRACE = timedelta(seconds=10)


def send(record: CallsBack, body: str) -> None:
    """Hand a finished job's (or batch's) status (``body``, JSON) to the delivery queue. A delivery that
    cannot be queued stays pending, for the reconciler."""
    try:
        backends.current().celery.send_task(
            DELIVERY_TASK_NAME,
            kwargs={"url": record.callback_url, "body": body, "record_id": record.id},
            queue=CALLBACK_QUEUE,
        )
    except (OperationalError, RedisError, RuntimeError) as error:
        logger.error("%s: its callback could not be queued (the reconciler tries again): %s", _named(record), error)
        return
    model = type(record)
    db.session.execute(
        db.update(model)
        .where(model.id == record.id, model.callback_state == CallbackState.PENDING)
        .values(callback_state=CallbackState.QUEUED),
        execution_options={"synchronize_session": False},
    )
    db.session.commit()
    logger.info("%s: its callback to %s is queued", _named(record), record.callback_url)


def pending(model: type[CallsBack]) -> list:
    """Finished jobs (or batches, as ``model`` says) whose callbacks were not queued when they ended."""
    query = db.select(model).where(
        model.callback_state == CallbackState.PENDING, model.finished_at < utcnow() - PENDING_GRACE
    )
    return list(db.session.execute(query).scalars())


def settle(record: CallsBack) -> None:
    """Keep the outcome of a delivery that is over in the job's (or batch's) row, with its attempts."""
    if record.callback_state == CallbackState.QUEUED:
        _keep_if_over(record, _recorded_attempts(record))


def settle_queued(model: type[CallsBack]) -> None:
    """Settle every delivery the workers still hold (the reconciler's round): nobody may poll its job (or
    batch) again before Redis forgets its attempts, after CHATTTS_FARM_RESULT_TTL_S."""
    queued = db.select(model).where(model.callback_state == CallbackState.QUEUED)
    for record in db.session.execute(queued).scalars().all():  # each settle commits
        settle(record)


def delivery(record: CallsBack) -> dict | None:
    """The callback's part of a job's (or batch's) status: ``url``, ``state`` (``waiting`` until it ends,
    then ``pending``, ``queued``, ``retrying``, ``delivered`` or ``failed``) and its ``attempts`` so far.
    A delivery it finds over is kept in the row at once: the attempts it shows are the ones kept."""
    if record.callback_url is None:
        return None
    url, state, attempts = record.callback_url, record.callback_state or "waiting", record.callback_attempts or []
    if state == CallbackState.QUEUED:
        attempts = _recorded_attempts(record)
        state = attempts[-1]["outcome"] if attempts else state
        _keep_if_over(record, attempts)
    return {"url": url, "state": state, "attempts": attempts}


def _keep_if_over(record: CallsBack, attempts: list[dict]) -> None:
    """Write a delivery's outcome and attempts to its row once its last attempt says it is over."""
    if not attempts or attempts[-1]["outcome"] not in CallbackState.OVER:
        return
    model = type(record)
    db.session.execute(
        db.update(model)
        .where(model.id == record.id, model.callback_state == CallbackState.QUEUED)
        .values(callback_state=attempts[-1]["outcome"], callback_attempts=attempts),
        execution_options={"synchronize_session": False},
    )
    db.session.commit()


def _recorded_attempts(record: CallsBack) -> list[dict]:
    """The attempts the workers recorded; none while Redis cannot be read (the status still answers)."""
    try:
        return [
            json.loads(raw) for raw in backends.current().redis.lrange(redis_keys.callback_attempts(record.id), 0, -1)
        ]
    except RedisError as error:
        logger.warning("%s: its callback's attempts could not be read: %s", _named(record), error)
        return []


def _named(record: CallsBack) -> str:
    return f"{type(record).__name__.lower()} {record.id}"
