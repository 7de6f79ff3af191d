from __future__ import annotations

from flask import abort, current_app, render_template, request

from web import jobs, voices
from web.models import Job, JobStatus, db
from web.pages import bp

RECENT_JOBS = 100


@bp.app_context_processor
def model_banner() -> dict:
    """Pages warn when the farm runs on synthetic weights: their audio is noise, not speech."""
    settings = current_app.config["SETTINGS"]
    synthetic = settings.model.startswith("synthetic")
    if not synthetic:
        latest = db.session.execute(
            db.select(Job.result).where(Job.status == JobStatus.DONE).order_by(Job.finished_at.desc()).limit(1)
        ).scalar_one_or_none()
        synthetic = bool(latest) and latest.get("model") == "synthetic"
    return {"synthetic_model": synthetic, "max_text_chars": settings.max_text_chars}


@bp.get("/")
def index():
    return render_template("index.html", voices=voices.find([], None))


@bp.get("/jobs/<job_id>")
def job(job_id: str):
    found = db.session.get(Job, job_id)
    if found is None:
        abort(404, f"no job {job_id}")
    return render_template("job.html", job=jobs.refresh(found))


@bp.get("/jobs")
def job_list():
    recent = db.session.execute(db.select(Job).order_by(Job.created_at.desc()).limit(RECENT_JOBS)).scalars()
    return render_template("jobs.html", jobs=[jobs.refresh(j) for j in recent])


@bp.get("/voices")
def voice_catalog():
    tags = [tag for tag in request.args.get("tags", "").split(",") if tag.strip()]
    query = request.args.get("q", "").strip()
    return render_template("voices.html", voices=voices.find(tags, query or None),
                           tags=", ".join(voices.normalise_tags(tags)), query=query)
