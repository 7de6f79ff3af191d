"""The reconciler: jobs the database holds as unfinished but Redis has lost are enqueued again; and the
end of each job or batch with a callback is noticed, though nobody polls it (see web.callbacks).

Redis is the queue, the database is the record. If Redis loses its data (FLUSHALL, a restart without
persistence), a job can be unfinished in the database with no message anywhere and no state in the
result backend. Such a job is sent again under its own id; the audio key is per job, so a job that
was in fact still running somewhere at worst runs twice and writes the same key.

Several reconcilers may run (one beside each web host's processes): a Redis lock lets one at a time
look and re-enqueue, so two never both find a job lost and send it twice.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

from redis.exceptions import LockNotOwnedError

from chattts_farm import redis_keys
from web import backends, batches, jobs
from web.models import Job, JobStatus, db, utcnow

logger = logging.getLogger(__name__)

# A job younger than this may be between its database row and its message: leave it alone.
GRACE = timedelta(seconds=10)
# Far longer than a round takes; a reconciler killed while holding the lock holds it no longer than this.
LOCK_TIMEOUT_S = 300


def _queued_ids() -> set[str]:
    """Ids of every task message in any queue list or delivered-but-unacknowledged."""
    client = backends.current().redis
    ids: set[str] = set()
    raw_messages = list(client.hvals(redis_keys.UNACKED_HASH))
    for key in client.scan_iter(_type="list"):
        raw_messages.extend(client.lrange(key, 0, -1))
    for raw in raw_messages:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        if isinstance(message, list):  # unacked entries are [message, exchange, routing key]
            message = message[0]
        task_id = message.get("headers", {}).get("id") if isinstance(message, dict) else None
        if task_id:
            ids.add(task_id)
    return ids


def lost_jobs() -> list[Job]:
    unfinished = (
        db.session.execute(
            db.select(Job).where(
                Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)), Job.created_at < utcnow() - GRACE
            )
        )
        .scalars()
        .all()
    )
    if not unfinished:
        return []
    present = _queued_ids()
    backend = backends.current().celery.backend
    return [
        job for job in unfinished if job.id not in present and backend.get_task_meta(job.id).get("status") == "PENDING"
    ]


def reconcile() -> list[str]:
    """Enqueue every lost job again under its own id; returns their ids. Then hand the callbacks of jobs
    that have ended to the delivery queue. While another reconciler is at work, leaves it to that one and
    returns none."""
    lock = backends.current().redis.lock(redis_keys.RECONCILER_LOCK, timeout=LOCK_TIMEOUT_S, blocking=False)
    if not lock.acquire():
        logger.info("another reconciler is at work: leaving this round to it")
        return []
    try:
        resent = []
        for job in lost_jobs():
            jobs.enqueue(job)
            job.status = JobStatus.QUEUED
            job.progress = 0.0
            logger.warning("job %s was lost by Redis: enqueued again", job.id)
            resent.append(job.id)
        db.session.commit()
        jobs.watch_for_callbacks()
        batches.watch_for_callbacks()
        return resent
    finally:
        try:
            lock.release()
        except LockNotOwnedError:
            logger.warning(
                "a reconciler round took longer than its lock (%s s): another may have sent the same jobs",
                LOCK_TIMEOUT_S,
            )
