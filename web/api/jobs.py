"""The job endpoints: submit, read, list, download and cancel jobs."""

from __future__ import annotations

from flask import Response, current_app, request, url_for

from chattts_farm.callbacks import CallbackPolicy
from chattts_farm.contract import MIME_TYPES
from web import audio_formats, audio_responses, captions, jobs, streaming, voices
from web.api import bp
from web.errors import ApiError
from web.job_status import describe
from web.json_body import json_object
from web.models import Job, JobStatus
from web.waiting import WaitSlot

MAX_LIST_LIMIT = 500


def visible_job(job_id: str) -> Job:
    """The job as the caller may see it; 404 when there is none."""
    job = jobs.visible(job_id)
    if job is None:  # also when it is another key's job: the same answer, so ids cannot be probed
        raise ApiError(404, f"no job {job_id}")
    return job


@bp.post("/jobs")
def create_job():
    settings = current_app.config["SETTINGS"]
    synthesis, voice = voices.job_request(
        json_object(), max_text_chars=settings.max_text_chars, callbacks=CallbackPolicy.from_settings(settings)
    )
    job = jobs.submit(synthesis, voice)
    body = {
        "id": job.id,
        "status": job.status,
        "status_url": url_for("api.get_job", job_id=job.id),
        "audio_url": url_for("api.job_audio", job_id=job.id),
        "stream_url": url_for("api.job_stream", job_id=job.id),
    }
    return body, 202, {"Location": body["status_url"]}


@bp.get("/jobs/<job_id>")
def get_job(job_id: str):
    return describe(jobs.refresh(visible_job(job_id)))


@bp.get("/jobs")
def list_jobs():
    status = request.args.get("status")
    if status is not None and status not in JobStatus.ALL:
        raise ApiError(400, f"status must be one of {', '.join(JobStatus.ALL)}", "status")
    try:
        limit = int(request.args.get("limit", 50))
    except ValueError:
        raise ApiError(400, "limit must be an integer", "limit") from None
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise ApiError(400, f"limit must be between 1 and {MAX_LIST_LIMIT}", "limit")
    listed = jobs.recent(limit, status)
    return {"jobs": [describe(job) for job in listed if status is None or job.status == status]}


@bp.get("/jobs/<job_id>/audio")
def job_audio(job_id: str):
    job = visible_job(job_id)
    # A download is a request held open as a stream is: it counts against its key's bound, and a reader
    # that takes nothing for the send timeout is disconnected. A HEAD sends no body and takes no slot.
    slot = WaitSlot.take() if request.method == "GET" else None
    try:
        return audio_responses.send(
            jobs.open_audio(job), MIME_TYPES[job.format], f"chattts-{job.id}.{job.format}", held_by=slot
        )
    except BaseException:
        if slot is not None:
            slot.release()
        raise


@bp.get("/jobs/<job_id>/stream")
def job_stream(job_id: str):
    """The job's audio as it is made, encoded as it comes (``format``: wav, the default, pcm, mp3, ogg, flac)."""
    stream_format = request.args.get("format", "wav")
    if stream_format not in audio_formats.FORMATS:
        raise ApiError(400, f"format must be one of {', '.join(audio_formats.FORMATS)}", "format")
    job = visible_job(job_id)
    if request.method == "HEAD":
        # The headers alone, at once: no audio is awaited, so no slot is taken (nor is the sample rate
        # known, which comes with the first audio). An iterator, not an empty body, which Werkzeug would
        # give a Content-Length of 0: the GET's body is chunked, of a length nobody knows yet. A job that
        # has failed or was cancelled is answered as its GET would be.
        if jobs.refresh(job).status in (JobStatus.FAILED, JobStatus.CANCELLED):
            raise ApiError(409, f"job {job.id} {job.status}: {job.error}")
        headers = {"X-Job-Id": job.id, "Cache-Control": "no-store"}
        return Response(iter(()), mimetype=audio_formats.MIME_TYPES[stream_format], headers=headers)
    # A listener is a waiting request: it counts against its key's bound, as a speech call does.
    slot = WaitSlot.take()
    try:
        audio = streaming.open_audio(job, failed_status=409)
    except BaseException:
        slot.release()
        raise
    return Response(
        slot.held_while(streaming.cut_off_when_broken(streaming.encoded(audio, stream_format))),
        mimetype=audio_formats.MIME_TYPES[stream_format],
        headers={"X-Sample-Rate": str(audio.sample_rate), "X-Job-Id": audio.job_id, "Cache-Control": "no-store"},
    )


@bp.get("/jobs/<job_id>/captions")
def job_captions(job_id: str):
    """A finished job's captions: one cue per segment of its text (``format``: vtt, the default, or srt)."""
    caption_format = request.args.get("format", "vtt")
    if caption_format not in captions.FORMATS:
        raise ApiError(400, f"format must be one of {', '.join(captions.FORMATS)}", "format")
    job = jobs.refresh(visible_job(job_id))
    if job.status != JobStatus.DONE:
        raise ApiError(409, f"job {job.id} is {job.status}, not done: it has no captions")
    timeline = (job.result or {}).get("timeline")
    if timeline is None:
        raise ApiError(409, f"job {job.id} finished before the farm recorded where its segments fall: no captions")
    return Response(
        captions.WRITERS[caption_format](timeline),
        content_type=f"{captions.MIME_TYPES[caption_format]}; charset=utf-8",
        headers={"Content-Disposition": f'inline; filename="chattts-{job.id}.{caption_format}"'},
    )


@bp.delete("/jobs/<job_id>")
def cancel_job(job_id: str):
    return describe(jobs.cancel(visible_job(job_id)))
