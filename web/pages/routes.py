from __future__ import annotations

from urllib.parse import urlsplit

from flask import abort, current_app, redirect, render_template, request, send_from_directory, url_for

from chattts_farm import ssml
from chattts_farm.contract import (
    FORMATS,
    MAX_CLIP_S,
    MAX_MIX_PARTS,
    MAX_MIX_WEIGHT,
    MAX_TRANSCRIPT_CHARS,
    MIN_CLIP_S,
    OPENAI_VOICE_SEEDS,
)
from web import batches, clips, jobs, voices
from web.access import api_keys, sessions
from web.models import Job, JobStatus, Voice, VoiceKind, db
from web.pages import bp

RECENT_JOBS = 100
# The page composes blends of at least two voices (the API takes one: a blend of one voice is that voice).
BLEND_MIN_PARTS = 2
NOT_A_LOCAL_TARGET = "The page to go to after sign-in is not a page of this site: sign in to go to the home page."


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
    return render_template(
        "index.html", voices=voices.find([], None), openai_voices=list(OPENAI_VOICE_SEEDS), ssml_summary=ssml.SUMMARY
    )


@bp.get("/jobs/<job_id>")
def job(job_id: str):
    found = jobs.visible(job_id)
    if found is None:
        abort(404, f"no job {job_id}")
    return render_template("job.html", job=jobs.refresh(found))


@bp.get("/jobs")
def job_list():
    return render_template("jobs.html", jobs=jobs.recent(RECENT_JOBS))


@bp.get("/batches/<batch_id>")
def batch(batch_id: str):
    found = batches.visible_or_none(batch_id)
    if found is None:
        abort(404, f"no batch {batch_id}")
    return render_template("batch.html", batch=found, items=batches.items(found))


@bp.get("/batches")
def batch_list():
    return render_template(
        "batches.html", batches=batches.recent(RECENT_JOBS), max_items=batches.MAX_ITEMS, formats=FORMATS
    )


@bp.get("/voices")
def voice_catalog():
    tags = voices.normalise_tags([tag for tag in request.args.get("tags", "").split(",") if tag.strip()])
    query = request.args.get("q", "").strip()
    kind = request.args.get("kind") or None
    # Each chip is a link to the catalog with its tag toggled: the filter works without scripts.
    chips = [
        {
            "name": tag,
            "active": tag in tags,
            "href": url_for(
                "pages.voice_catalog", tags=",".join(sorted(set(tags) ^ {tag})) or None, q=query or None, kind=kind
            ),
        }
        for tag in voices.tags_in_use()
    ]
    return render_template(
        "voices.html",
        voices=voices.find(tags, query or None, kind),
        tags=", ".join(tags),
        query=query,
        kind=kind,
        kinds=VoiceKind.ALL,
        chips=chips,
        blend_parts=_blend_parts_shown,
        # A clip voice has no embedding to mix.
        blendable=[
            *OPENAI_VOICE_SEEDS,
            *(voice.name for voice in voices.find([], None) if voice.kind != VoiceKind.CLIP),
        ],
        blend_min=BLEND_MIN_PARTS,
        blend_max=MAX_MIX_PARTS,
        blend_max_weight=int(MAX_MIX_WEIGHT),
        workshop_text=voices.WORKSHOP_TEXT,
        workshop_default=voices.WORKSHOP_VOICES_DEFAULT,
        workshop_max=voices.WORKSHOP_VOICES_MAX,
        openai_voices=list(OPENAI_VOICE_SEEDS),
        clip_min_s=f"{MIN_CLIP_S:g}",
        clip_max_s=f"{MAX_CLIP_S:g}",
        clip_max_mb=clips.MAX_CLIP_BYTES // 10**6,
        clip_transcript_chars=MAX_TRANSCRIPT_CHARS,
    )


def _blend_parts_shown(voice: Voice) -> list[dict]:
    """A blend's parts (:func:`web.voices.blend_parts`), each with its share of the mix in percent."""
    parts = voices.blend_parts(voice)
    total = sum(part["weight"] for part in parts)
    return [{**part, "share": round(100 * part["weight"] / total)} for part in parts]


@bp.get("/favicon.ico")
def favicon():
    """Browsers ask for /favicon.ico whatever a page links: the farm's icon, not a 404 on every page."""
    return send_from_directory(current_app.static_folder, "favicon.svg", mimetype="image/svg+xml", max_age=86400)


@bp.get("/ops")
def ops():
    return render_template("ops.html")


@bp.route("/sign-in", methods=["GET", "POST"])
def sign_in():
    """With keys on, a browser signs in with an API key; its session then stands for that key."""
    target = _local_target(request.values.get("next", ""))
    if target is None:
        return render_template("sign_in.html", next=url_for("pages.index"), error=NOT_A_LOCAL_TARGET), 400
    if request.method == "GET":
        return render_template("sign_in.html", next=target)
    if not sessions.csrf_ok(request.form.get(sessions.CSRF_FORM_FIELD)):
        return render_template("sign_in.html", next=target, error="The form had expired: try again."), 400
    api_key = api_keys.find_key(request.form.get("key", ""))
    if api_key is None:
        return render_template("sign_in.html", next=target, error="That key is unknown or revoked."), 401
    sessions.sign_in(api_key)
    return redirect(target)


@bp.post("/sign-out")
def sign_out():
    if not sessions.csrf_ok(request.form.get(sessions.CSRF_FORM_FIELD)):
        abort(400, "the form had expired: reload the page and sign out again")
    sessions.sign_out()
    return redirect(url_for("pages.sign_in"))


def _local_target(target: str) -> str | None:
    """Where to go after sign-in (the home page unless asked): a path on this site only, never another
    host, and with no control character (a CR or LF would split the Location header); None for any other."""
    if not target:
        return url_for("pages.index")
    # Checked before urlsplit, which drops tabs and line breaks from what it reads.
    if any(ord(character) < 0x20 or ord(character) == 0x7F for character in target):
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    return target
