"""The voice catalog endpoints: find, add, edit, delete, export and import voices, keep a job's voice,
and a voice's preview."""

from __future__ import annotations

import json

from flask import Response, current_app, request

from web import access, clips, jobs, sent_as_form, takes_uploads_up_to, voices
from web.api import bp
from web.api.jobs import visible_job
from web.job_status import describe
from web.json_body import json_body, json_object
from web.models import JobStatus


@bp.get("/voices")
def list_voices():
    found = voices.find(request.args.getlist("tag"), request.args.get("q"), request.args.get("kind"))
    return {"voices": [voices.describe(voice) for voice in found]}


# The form's other fields (name, tags, transcript, details) and its boundaries, beside the clip.
CLIP_FORM_ALLOWANCE = 64 * 1024


@bp.post("/voices")
@takes_uploads_up_to(clips.MAX_CLIP_BYTES + CLIP_FORM_ALLOWANCE, "audio", f"audio: {clips.TOO_BIG}")
def create_voice():
    """A voice from JSON (a seed, an embedding or a blend), or from a reference clip: a multipart form
    with the file ``audio`` and its ``transcript``."""
    if not sent_as_form():
        return voices.describe(voices.create(json_object())), 201
    access.refuse_cross_site_forms()
    return voices.describe(voices.create_from_clip(request.form.to_dict(), request.files.get("audio"))), 201


@bp.get("/voices/export")
def export_voices():
    return Response(
        json.dumps(voices.export(), ensure_ascii=False, indent=2),
        mimetype="application/json",
        headers={"Content-Disposition": 'attachment; filename="chattts-voices.json"'},
    )


@bp.post("/voices/import")
def import_voices():
    return voices.import_(json_body()), 200


@bp.get("/voices/<int:voice_id>")
def get_voice(voice_id: int):
    return voices.describe(voices.get(voice_id))


@bp.patch("/voices/<int:voice_id>")
def update_voice(voice_id: int):
    return voices.describe(voices.update(voices.get_to_change(voice_id), json_object()))


@bp.delete("/voices/<int:voice_id>")
def delete_voice(voice_id: int):
    voices.delete(voices.get_to_change(voice_id))
    return "", 204


@bp.post("/voices/from-job/<job_id>")
def voice_from_job(job_id: str):
    job = jobs.refresh(visible_job(job_id))
    return voices.describe(voices.from_job(job, json_object())), 201


@bp.post("/voices/workshop")
def voice_workshop():
    """New random voices to audition: one sentence spoken in each, submitted as one batch."""
    made = voices.workshop(json_object(), current_app.config["SETTINGS"].max_text_chars)
    return {"jobs": [describe(job) for job in made]}, 202


@bp.post("/voices/<int:voice_id>/preview")
def preview_voice(voice_id: int):
    """The caller's kept preview job of the voice: the existing one while its audio lives, else a new one."""
    job = voices.preview(voices.get(voice_id), current_app.config["SETTINGS"].max_text_chars)
    return describe(job), 200 if job.status == JobStatus.DONE else 202
