"""Retention: audio past ``CHATTTS_FARM_AUDIO_TTL_S`` and finished jobs' rows past
``CHATTTS_FARM_JOB_RETENTION_S`` are deleted (``chattts-farm gc``, which ``up`` and compose run
every ``CHATTTS_FARM_GC_INTERVAL_S``), and with them a batch that ended as long ago, once none of its
items is left. A job whose audio has gone answers 410 for it; a job whose row has gone is unknown (404).
Unfinished jobs are never deleted, however old."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from flask import current_app

from web import backends
from web.models import Batch, Job, JobStatus, db, utcnow

logger = logging.getLogger(__name__)

# Rows deleted per transaction: a long delete would hold SQLite's one write lock from every request.
DELETE_BATCH = 500


@dataclass(frozen=True)
class Collected:
    audio: int
    jobs: int
    batches: int


def collect() -> Collected:
    """Delete the audio and the job rows past their retention; how many of each."""
    settings = current_app.config["SETTINGS"]
    store = backends.current().audio
    audio = store.expire(time.time() - settings.audio_ttl_s)
    cutoff = utcnow() - timedelta(seconds=settings.job_retention_s)
    deleted_jobs = 0
    while True:
        old = db.session.execute(
            db.select(Job.id, Job.audio_key)
            .where(Job.status.in_(JobStatus.FINISHED), Job.finished_at < cutoff)
            .limit(DELETE_BATCH)
        ).all()
        if not old:
            break
        # The audio of a job kept longer than its row (a longer audio TTL) goes with the row.
        audio += sum(store.delete(key) for _, key in old if key)
        db.session.execute(db.delete(Job).where(Job.id.in_([job_id for job_id, _ in old])))
        db.session.commit()
        deleted_jobs += len(old)
    # Its items went above (each ended before it did): an item still unfinished keeps its batch.
    deleted_batches = db.session.execute(
        db.delete(Batch).where(Batch.finished_at < cutoff, ~db.select(Job.id).where(Job.batch_id == Batch.id).exists()),
        execution_options={"synchronize_session": False},
    ).rowcount
    db.session.commit()
    logger.info("gc: deleted %d audio file(s), %d job row(s), %d batch row(s)", audio, deleted_jobs, deleted_batches)
    return Collected(audio, deleted_jobs, deleted_batches)
