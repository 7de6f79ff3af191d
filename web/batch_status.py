"""A batch's status as the API answers it (``GET /api/batches/<id>``) and its callback sends it, and
the noticing of its end: below web.jobs, whose ends notice their batches' (web.batches, which
submits and cancels batches, is above both)."""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from typing import Any

from flask import current_app, has_request_context, url_for
from sqlalchemy import case

from web import callbacks
from web.models import Batch, CallbackState, Job, JobStatus, db, utcnow

logger = logging.getLogger(__name__)


def notice_end(batch_id: str) -> None:
    """Once the batch's last item has ended, mark the batch ended and queue its callback; of the requests
    that notice at once, only the one whose update marks it does."""
    still_running = db.session.execute(
        db.select(Job.id).where(Job.batch_id == batch_id, Job.status.not_in(JobStatus.FINISHED)).limit(1)
    ).first()
    if still_running is not None:
        return
    marked = db.session.execute(
        db.update(Batch)
        .where(Batch.id == batch_id, Batch.finished_at.is_(None))
        .values(
            finished_at=utcnow(),
            callback_state=case((Batch.callback_url.is_not(None), CallbackState.PENDING), else_=None),
        ),
        execution_options={"synchronize_session": False},
    )
    db.session.commit()
    if marked.rowcount == 1:
        batch = db.session.get(Batch, batch_id)
        logger.info("batch %s ended (%s)", batch_id, batch.status)
        if batch.callback_url is not None:
            call_back(batch)


def call_back(batch: Batch) -> None:
    """Hand an ended batch's status to its callback's delivery queue."""
    # The reconciler notices ends outside any request: its status's URLs are the paths a request's are.
    with nullcontext() if has_request_context() else current_app.test_request_context():
        body = json.dumps(describe(batch, stored_items(batch)))
    callbacks.send(batch, body)


def describe(batch: Batch, batch_items: list[Job], *, listed: bool = True) -> dict[str, Any]:
    """A batch's status as the API answers it and its callback sends it: counts of its items by status,
    its progress (the share of its items' work done), and each item (unless not ``listed``)."""
    counts = dict.fromkeys(JobStatus.ALL, 0)
    for item in batch_items:
        counts[item.status] += 1
    progress = sum(1.0 if item.status in JobStatus.FINISHED else item.progress for item in batch_items)
    described = {
        "id": batch.id,
        "status": batch.status,
        "size": batch.size,
        "counts": counts,
        "progress": round(progress / max(batch.size, 1), 3),
        "created_at": batch.created_at.isoformat(),
        "finished_at": batch.finished_at.isoformat() if batch.finished_at else None,
        "cancelled_at": batch.cancelled_at.isoformat() if batch.cancelled_at else None,
        "status_url": url_for("api.get_batch", batch_id=batch.id),
        "archive_url": url_for("api.batch_archive", batch_id=batch.id),
        "callback": callbacks.delivery(batch),
    }
    if listed:
        described["items"] = [_describe_item(item) for item in batch_items]
    return described


def _describe_item(job: Job) -> dict[str, Any]:
    return {
        "item": job.batch_item,
        "custom_id": job.custom_id,
        "job_id": job.id,
        "status": job.status,
        "progress": round(job.progress, 3),
        "error": job.error,
        "duration_s": job.duration_s,
        "status_url": url_for("api.get_job", job_id=job.id),
        "audio_url": url_for("api.job_audio", job_id=job.id),
    }


def stored_items(batch: Batch) -> list[Job]:
    """The batch's items in their order, as stored."""
    return list(db.session.execute(db.select(Job).where(Job.batch_id == batch.id).order_by(Job.batch_item)).scalars())
