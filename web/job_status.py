"""A job's status as the API answers it (``GET /api/jobs/<id>``) and as its callback sends it."""

from __future__ import annotations

from datetime import UTC, datetime

from flask import url_for

from chattts_farm.contract import MIME_TYPES
from web import callbacks
from web.models import Job, JobStatus


def describe(job: Job) -> dict:
    audio_url = url_for("api.job_audio", job_id=job.id, _external=False)
    result = None
    if job.status == JobStatus.DONE and job.result:
        result = {
            "duration_s": job.duration_s,
            "format": job.format,
            "mime_type": MIME_TYPES[job.format],
            "sample_rate": job.result.get("sample_rate"),
            "segments": job.result.get("segments"),
            "batch_size": job.result.get("batch_size"),
            "worker": job.result.get("worker"),
            "received_at": _iso(job.result.get("received_at")),
            "started_at": _iso(job.result.get("started_at")),
            "first_chunk_s": (job.result.get("timings") or {}).get("first_chunk_s"),
            "first_chunk_engine_s": (job.result.get("timings") or {}).get("first_chunk_engine_s"),
            "model": job.result.get("model"),
            "seed": job.result.get("seed"),
            "quality": job.result.get("quality"),
            "timeline": job.result.get("timeline"),
            "audio_url": audio_url,
            "captions_url": url_for("api.job_captions", job_id=job.id),
        }
    return {
        "id": job.id,
        "status": job.status,
        "progress": round(job.progress, 3),
        "error": job.error,
        "created_at": job.created_at.isoformat(),
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "text": job.text,
        "voice": {
            "catalog_id": job.voice_id,
            "name": job.voice.name if job.voice else None,
            "seed": job.voice_seed,
            "mix": job.voice_mix["mix"] if job.voice_mix else None,
        },
        "format": job.format,
        "parameters": job.parameters,
        "status_url": url_for("api.get_job", job_id=job.id),
        "audio_url": audio_url,
        "result": result,
        "callback": callbacks.delivery(job),
    }


def _iso(epoch_seconds: float | None) -> str | None:
    return None if epoch_seconds is None else datetime.fromtimestamp(epoch_seconds, UTC).isoformat()
