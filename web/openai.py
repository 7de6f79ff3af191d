"""``POST /v1/audio/speech``: the OpenAI text-to-speech API, served by the farm.

It records and enqueues an ordinary job that streams, and holds the request while the job runs (see
:mod:`web.waiting`: a bounded number of waits per key, and a client that hangs up leaves its job to
run on as any other): the audio is sent as it is made, encoded by the web (see :mod:`web.streaming`;
flac whole at the end). ``stream_format: "sse"`` sends the same bytes as OpenAI's
``speech.audio.delta`` events (base64), then ``speech.audio.done``. ``GET /v1/audio/voices`` lists
the voice names it takes. A blend of voices may be written as Kokoro-FastAPI writes one,
``alloy(2)+nova(1)``.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator

from flask import Blueprint, Response, current_app

from chattts_farm.contract import OPENAI_VOICE_SEEDS, Blend, InvalidRequest, SynthesisRequest
from chattts_farm.speech_length import speed_of_rate
from web import audio_formats, jobs, streaming, voices
from web.errors import ApiError
from web.json_body import json_object
from web.models import Voice
from web.waiting import WaitSlot

bp = Blueprint("openai", __name__, url_prefix="/v1")

# OpenAI format -> the web's encoder (web.audio_formats). OpenAI's "opus" is Opus in Ogg, as the farm's ogg.
FORMATS = {"mp3": "mp3", "opus": "ogg", "flac": "flac", "wav": "wav", "pcm": "pcm"}
UNSUPPORTED = {"aac": "aac is not supported: no well-kept encoder is available to the farm; use mp3 or opus"}
STREAM_FORMATS = ("audio", "sse")
# Kokoro-FastAPI's blend: voices joined by +, each with an optional weight in brackets (1 when left out).
_BLEND_PART = re.compile(r"\s*([^+()]*?)\s*(?:\(\s*(-?[0-9]+(?:\.[0-9]*)?|-?\.[0-9]+)\s*\))?\s*")


@bp.post("/audio/speech")
def speech():
    body = json_object()
    # The farm has one model: any name is accepted, as long as it is a name.
    if not isinstance(body.get("model", ""), str):
        raise ApiError(400, "model must be a string", "model")
    response_format = body.get("response_format", "mp3")
    # Only a string can be looked up: a list or an object is no dictionary key.
    if isinstance(response_format, str) and response_format in UNSUPPORTED:
        raise ApiError(400, UNSUPPORTED[response_format], "response_format")
    if not isinstance(response_format, str) or response_format not in FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)}", "response_format")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= speed <= 4.0:
        raise ApiError(400, "speed must be a number from 0.25 to 4.0", "speed")
    text = body.get("input")
    if not isinstance(text, str):
        raise ApiError(400, "input is required: the text to speak", "input")
    stream_format = body.get("stream_format", "audio")
    if not isinstance(stream_format, str) or stream_format not in STREAM_FORMATS:
        raise ApiError(400, f"stream_format must be one of {', '.join(STREAM_FORMATS)}", "stream_format")
    sent_format = FORMATS[response_format]
    voice = _voice(body.get("voice"))
    settings = current_app.config["SETTINGS"]
    try:
        synthesis = SynthesisRequest.from_arguments(
            {
                "text": text,
                "voice": voices.argument(voice),
                # The job's stored audio: in the format sent (raw samples are stored as a WAV).
                "format": "wav" if sent_format == "pcm" else sent_format,
                "speed": speed_of_rate(speed),
                "stream": True,
                # Its caller waits for the audio on the open response.
                "priority": "interactive",
            },
            max_text_chars=settings.max_text_chars,
        )
    except InvalidRequest as error:
        # The farm calls it text; this API calls it input.
        raise ApiError(
            400,
            f"input: {error.message}" if error.field == "text" else str(error),
            "input" if error.field == "text" else error.field,
        ) from None
    # The slot is taken before the job exists: a refused request leaves nothing behind to retry into a twin.
    slot = WaitSlot.take()
    try:
        job = jobs.submit(synthesis, voice if isinstance(voice, Voice) else None)
        # 502 when the job fails before its first audio: the request was valid, the worker failed it.
        audio = streaming.open_audio(job, failed_status=502)
    except BaseException:
        slot.release()
        raise
    chunks = streaming.encoded(audio, sent_format)
    if stream_format == "sse":
        body, mime_type = _sse(chunks, text, audio), "text/event-stream"
    else:
        body, mime_type = streaming.cut_off_when_broken(chunks), audio_formats.MIME_TYPES[sent_format]
    return Response(
        slot.held_while(body), mimetype=mime_type, headers={"X-Job-Id": audio.job_id, "Cache-Control": "no-store"}
    )


@bp.get("/audio/voices")
def voice_list():
    """Every voice name /v1/audio/speech takes, as Kokoro-FastAPI lists its voices (``id`` is what to send
    as ``voice``; Open WebUI reads it): OpenAI's names, then the catalog's voices (each name once)."""
    names = list(OPENAI_VOICE_SEEDS)
    names += [voice.name for voice in voices.find([], None) if voice.name not in OPENAI_VOICE_SEEDS]
    return {"voices": [{"id": name, "name": name} for name in names]}


def _sse(chunks: Iterator[bytes], text: str, audio: streaming.JobAudio) -> Iterator[str]:
    """OpenAI's speech events: one ``speech.audio.delta`` per chunk (base64), then ``speech.audio.done``;
    or, when the audio stops short (the job failed, was cancelled or restarted), an ``error`` event in
    OpenAI's error shape instead of the ``done``."""
    try:
        for data in chunks:
            yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    except streaming.StreamBroken as stopped:
        if stopped.code != "hung_up":
            error = {"type": "server_error", "code": f"job_{stopped.code}", "message": stopped.message, "param": None}
            yield _event({"type": "error", "error": error})
        return
    tokens = (audio.summary or {}).get("tokens", 0)
    # The web has no text tokenizer: the input is counted in characters.
    usage = {"input_tokens": len(text), "output_tokens": tokens, "total_tokens": len(text) + tokens}
    yield _event({"type": "speech.audio.done", "usage": usage})


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _voice(value: object) -> Voice | int | str | Blend:
    """An OpenAI voice name, a catalog voice name, a seed, an embedding string or a blend, as every job
    takes; a blend also in Kokoro-FastAPI's form (:func:`kokoro_blend`) unless a catalog voice has that name."""
    if value is None:
        raise ApiError(400, "voice is required: an OpenAI voice name, a catalog voice name or a seed", "voice")
    if isinstance(value, str) and (blend := kokoro_blend(value)) is not None and voices.named(value) is None:
        value = blend
    return voices.to_speak(value)


def kokoro_blend(text: str) -> dict | None:
    """``alloy(2)+nova(1)`` as a blend's parts (``a+b``: equal parts); None for text not written so (no +
    and no weight, or a part without a voice)."""
    matches = [_BLEND_PART.fullmatch(part) for part in text.split("+")]
    if not all(match and match[1] for match in matches) or ("+" not in text and not matches[0][2]):
        return None
    return {"mix": [{"voice": match[1], "weight": float(match[2] or 1)} for match in matches]}
