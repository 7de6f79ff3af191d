"""The OpenAPI 3.1 description of the JSON API, served at /api/openapi.json.

It describes the farm that serves it: with keys on (``CHATTTS_FARM_REQUIRE_API_KEY``), a bearer key is
required on every operation but this description, and the refusals that come with keys (401, 403, 429,
and 503 when Redis, which counts the requests, is away) are documented on each; with keys off, neither.
"""

from __future__ import annotations

from flask import current_app

from chattts_farm import ssml
from chattts_farm.callbacks import MAX_URL_CHARS, SIGNATURE_HEADER
from chattts_farm.contract import (
    DEFAULT_PRIORITY,
    EMBEDDING_PATTERN,
    FORMATS,
    MAX_CLIP_S,
    MAX_EMBEDDING_CHARS,
    MAX_MIX_PARTS,
    MAX_MIX_WEIGHT,
    MAX_SAMPLE_CHARS,
    MAX_SEED,
    MAX_TRANSCRIPT_CHARS,
    MIN_CLIP_S,
    OPENAI_VOICE_SEEDS,
    PRIORITIES,
)
from chattts_farm.text import SPEAKABLE_CHARACTER, visible_character
from web.access import PUBLIC_PATHS, SAFE_METHODS
from web.access.sessions import CSRF_HEADER
from web.api import bp
from web.audio_formats import FORMATS as STREAM_FORMATS
from web.audio_formats import MIME_TYPES as STREAM_MIME_TYPES
from web.batches import CUSTOM_ID
from web.batches import DEFAULT_PRIORITY as BATCH_DEFAULT_PRIORITY
from web.batches import MAX_ITEMS as MAX_BATCH_ITEMS
from web.clips import MAX_CLIP_BYTES
from web.models import BatchStatus, JobStatus, VoiceKind

_ERROR = {"$ref": "#/components/schemas/Error"}
_ERROR_MEANINGS = {
    400: "a value is wrong: field names it",
    401: "no API key, or an unknown or revoked one",
    403: "a browser session signed in on the pages sent no valid X-CSRF-Token with this change",
    404: "no such job, batch or voice (another key's job or batch is not found either)",
    409: "not now: a name already taken, or a job that is not done",
    410: "the job's audio has expired",
    413: "the body is larger than CHATTTS_FARM_MAX_REQUEST_BYTES",
    412: "If-Match names another version of the audio than the one stored",
    416: "the Range asked for starts past the audio's end, or is an empty suffix (bytes=-0); Content-Range "
    "gives its length",
    422: "no voice of that name (neither an OpenAI voice name nor a catalog voice's) or id",
    429: "over one of the key's limits (rate, daily audio quota, jobs waiting): Retry-After says when to try again",
    502: "the job failed or was cancelled",
    503: "Redis or the workers could not be reached: try again shortly",
    504: "the job did not finish in time; it goes on (GET /api/jobs/{job_id})",
}
_NOT_THE_OWNER = (
    "the voice belongs to another key (only its owner or an admin key may change or delete it; a voice "
    "without an owner, only an admin key), or " + _ERROR_MEANINGS[403]
)
_RESERVED_NAME = "the name is an OpenAI voice name, which only an admin key may give a catalog voice"
_TOO_MANY_WAITING = (
    "CHATTTS_FARM_MAX_WAITS_PER_KEY calls of this key (with keys off: of all callers) already wait for their "
    "audio, or " + _ERROR_MEANINGS[429]
)
# A submission's own 503: the farm's backlog is full (web.admission).
_QUEUE_FULL = (
    "CHATTTS_FARM_MAX_QUEUED_JOBS jobs wait to start already: Retry-After says when to try again; or "
    + _ERROR_MEANINGS[503]
)
_BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": (
        "An API key made with `chattts-farm keys create NAME`, sent as `Authorization: Bearer <key>`. A browser "
        "signed in on the pages may send its session cookie instead, with the page's X-CSRF-Token on every change."
    ),
}
_EMBEDDING = {
    "type": "string",
    "minLength": 16,
    "maxLength": MAX_EMBEDDING_CHARS,
    "pattern": EMBEDDING_PATTERN,
    "description": "A ChatTTS speaker-embedding string.",
}
_SPEAKER_SAMPLE = {
    "type": "string",
    "minLength": 16,
    "maxLength": MAX_SAMPLE_CHARS,
    "pattern": EMBEDDING_PATTERN,
    "description": "A ChatTTS speaker sample (spk_smp): a reference clip's DVAE codes, as Chat.sample_audio_speaker "
    "writes them.",
}
_TRANSCRIPT = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_TRANSCRIPT_CHARS,
    "pattern": SPEAKABLE_CHARACTER,
    "description": "The reference clip's words (txt_smp), which ChatTTS reads before every text in this voice: "
    "read as a text to speak is (control and invisible characters dropped, something speakable required).",
}
_CLIP_FORM = {
    "type": "object",
    "required": ["name", "transcript", "audio"],
    "additionalProperties": False,
    "properties": {
        "csrf_token": {"type": "string", "description": "The pages' CSRF token, when a page's form sends it."},
        "name": {"type": "string", "minLength": 1, "maxLength": 100},
        "tags": {"type": "string", "description": "Comma-separated; each stored lower-case, at most 64 characters."},
        "transcript": _TRANSCRIPT,
        "audio": {
            "type": "string",
            "contentMediaType": "application/octet-stream",
            "description": f"The clip: WAV, FLAC, Ogg (Opus, Vorbis) or MP3, mono or stereo, {MIN_CLIP_S:g} to "
            f"{MAX_CLIP_S:g} s, at most {MAX_CLIP_BYTES // 10**6} MB. A file that is no such clip is refused "
            "(a 400 naming audio; 413 past the size).",
        },
        "description": {"type": "string", "maxLength": 2000},
        "gender": {"type": "string", "maxLength": 20},
        "age": {"type": "string", "maxLength": 20},
    },
}
_ONE_VOICE = {
    "description": (
        f"An OpenAI voice name ({', '.join(OPENAI_VOICE_SEEDS)}: each a fixed seed, unless an admin key gave a "
        "catalog voice its name), a catalog voice name, an integer seed, or a ChatTTS speaker-embedding string."
    ),
    "oneOf": [{"type": "integer", "minimum": 0, "maximum": MAX_SEED}, {"type": "string", "minLength": 1}],
}
_BLEND_PARTS = {
    "type": "array",
    "description": (
        "The voices of a blend and their weights (1 when left out; divided by their sum): each voice's speaker "
        "embedding is scaled to unit length, as ChatTTS scales one before use, and the blend is their weighted "
        "mean. Not all weights may be 0. A blend does not mix into another."
    ),
    "minItems": 1,
    "maxItems": MAX_MIX_PARTS,
    "items": {
        "type": "object",
        "required": ["voice"],
        "additionalProperties": False,
        "properties": {
            "voice": _ONE_VOICE,
            "weight": {"type": "number", "minimum": 0, "maximum": MAX_MIX_WEIGHT},
        },
    },
    # A weight above 0 somewhere (a part without a weight weighs 1).
    "contains": {"properties": {"weight": {"exclusiveMinimum": 0}}},
}
_VOICE_ARG = {
    "description": f"{_ONE_VOICE['description']} Or a blend of such voices: an object with mix.",
    "oneOf": [
        *_ONE_VOICE["oneOf"],
        {"type": "object", "required": ["mix"], "additionalProperties": False, "properties": {"mix": _BLEND_PARTS}},
    ],
}


def _error(code: int, meaning: str | None = None) -> dict:
    response = {"description": meaning or _ERROR_MEANINGS[code], "content": {"application/json": {"schema": _ERROR}}}
    if code == 429 or meaning == _QUEUE_FULL:
        response["headers"] = {
            "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer", "minimum": 1}}
        }
    return response


def _errors(*codes: int) -> dict:
    return {str(code): _error(code) for code in codes}


def _require_keys(paths: dict) -> None:
    """Every operation but the public ones needs a key, which counts its requests in Redis; a change made
    through a signed-in browser session needs the page's CSRF token (web.access)."""
    for path, operations in paths.items():
        for method, operation in operations.items():
            if path in PUBLIC_PATHS:
                operation["security"] = []
                continue
            refusals = _errors(401, 429, 503, *([] if method.upper() in SAFE_METHODS else [403]))
            operation["responses"] = dict(sorted({**refusals, **operation["responses"]}.items()))


def _json_body(schema: dict) -> dict:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _json(schema: dict, description: str = "ok") -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def openapi_description(max_text_chars: int, keys_required: bool, callbacks: bool = False) -> dict:
    """The API this farm serves: with ``callbacks`` (a callback secret is set) a job takes a callback_url."""
    text = {
        "type": "string",
        "minLength": 1,
        "maxLength": max_text_chars,
        "pattern": SPEAKABLE_CHARACTER,
        "description": (
            "Plain text, or SSML: a text that begins with <speak> (or with an XML declaration, comment or DOCTYPE) "
            f"is read as SSML, of which the farm takes a subset: {ssml.SUMMARY} SSML tags in a text that is no "
            "<speak> document are refused. ChatTTS reads Latin letters and Chinese characters: other characters "
            "are dropped, control and invisible characters first, and text with nothing left to speak is refused "
            "(the pattern: a letter, not counting those of [control_tags] or SSML markup alone). maxLength counts "
            "the text as sent."
        ),
    }
    job_request = {
        "type": "object",
        "required": ["text"],
        "additionalProperties": False,
        "not": {"required": ["voice", "voice_id"]},
        "properties": {
            "text": text,
            "voice": _VOICE_ARG,
            "voice_id": {"type": "integer", "description": "A catalog voice's id, instead of voice."},
            "format": {"type": "string", "enum": list(FORMATS)},
            "speed": {"type": "integer", "minimum": 1, "maximum": 9},
            "temperature": {"type": "number", "minimum": 0.01, "maximum": 2},
            "top_p": {"type": "number", "minimum": 0.01, "maximum": 1},
            "top_k": {"type": "integer", "minimum": 1, "maximum": 626},
            "repetition_penalty": {"type": "number", "minimum": 1, "maximum": 2},
            "refine_text": {"type": "boolean"},
            "oral": {"type": "integer", "minimum": 0, "maximum": 9},
            "laugh": {"type": "integer", "minimum": 0, "maximum": 2},
            "break": {"type": "integer", "minimum": 0, "maximum": 7},
            "seed": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_SEED},
            "stream": {"type": "boolean"},
            "priority": {
                "type": "string",
                "enum": list(PRIORITIES),
                "default": DEFAULT_PRIORITY,
                "description": (
                    "interactive jobs take the next free engine slot ahead of waiting normal and bulk ones; "
                    "a waiting job goes up a class for each 30 s it waits, so bulk work still progresses. "
                    "The speak form and /v1/audio/speech send interactive jobs."
                ),
            },
        },
    }
    if callbacks:
        job_request["properties"]["callback_url"] = {
            "type": "string",
            "format": "uri",
            "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://",
            "maxLength": MAX_URL_CHARS,
            "description": (
                "Where the job's status (this API's Job) is POSTed when it ends (done, failed or cancelled), "
                f"signed: {SIGNATURE_HEADER}: sha256=<hex HMAC-SHA256 of the raw body> under "
                "CHATTTS_FARM_CALLBACK_SECRET (a farm without one lists no callback_url and refuses it). "
                "http or https to a public address only: "
                "loopback, private, link-local, multicast, reserved and unspecified addresses are refused "
                "(400 naming callback_url), and checked again once the host name is resolved, unless the host "
                "is in CHATTTS_FARM_CALLBACK_ALLOWED_HOSTS. Retried with backoff on errors, time-outs and any "
                "answer but a 2xx; redirects are not followed."
            ),
        }
    callback = {
        "type": ["object", "null"],
        "description": "The job's callback (null without a callback_url) and how its delivery goes.",
        "properties": {
            "url": {"type": "string"},
            "state": {
                "type": "string",
                "enum": ["waiting", "pending", "queued", "retrying", "delivered", "failed"],
                "description": "waiting while the job runs; pending until its delivery is queued; then queued, "
                "retrying after a failed attempt, and at last delivered or failed.",
            },
            "attempts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "attempt": {"type": "integer", "minimum": 1},
                        "at": {"type": "number", "description": "Unix time"},
                        "status_code": {"type": ["integer", "null"]},
                        "error": {"type": ["string", "null"]},
                        "outcome": {"type": "string", "enum": ["delivered", "retrying", "failed"]},
                        "retry_in_s": {"type": ["number", "null"]},
                    },
                },
            },
        },
    }
    defaults = {
        name: schema for name, schema in job_request["properties"].items() if name not in ("text", "callback_url")
    }
    batch_item = {
        "type": "object",
        "required": ["text"],
        "additionalProperties": False,
        "not": {"required": ["voice", "voice_id"]},
        "description": (
            "A job's fields, each taking the batch's default where the item leaves it out (an item's voice, or "
            "voice_id, replaces the default's either way)."
        ),
        "properties": {
            **job_request["properties"],
            "priority": {
                **job_request["properties"]["priority"],
                "default": BATCH_DEFAULT_PRIORITY,
                "description": "bulk unless the item or the batch's defaults say otherwise: "
                + job_request["properties"]["priority"]["description"],
            },
            "custom_id": {
                "type": ["string", "null"],
                "pattern": CUSTOM_ID.pattern,
                "description": "Echoed back, and the name of the item's audio in the archive (else, or when "
                "null, its place, from 0); unique in the batch.",
            },
        },
    }
    batch_request = {
        "type": "object",
        "required": ["items"],
        "additionalProperties": False,
        "not": {"required": ["voice", "voice_id"]},
        "description": (
            f"Up to {MAX_BATCH_ITEMS:,} items. Every field but items (and callback_url, the batch's own) is a "
            "default of every item, checked by itself (a 400 naming it). Every item is checked before any job is "
            "made: one bad item refuses the whole batch with a 400 naming it (items[5].text), and no job is left "
            "behind. The queue's caps, the key's rate limit and its daily audio quota count every item: all are "
            "accepted or none."
        ),
        "properties": {
            **defaults,
            "items": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_ITEMS, "items": batch_item},
        },
    }
    if callbacks:
        batch_request["properties"]["callback_url"] = {
            **job_request["properties"]["callback_url"],
            "description": "Where the batch's status (this API's Batch) is POSTed once every item has ended, "
            "signed and checked as a job's callback_url is (an item may have a callback_url of its own).",
        }
    batch_upload = {
        "type": "object",
        "required": ["items"],
        "additionalProperties": False,
        "properties": {
            "items": {
                "type": "string",
                "contentMediaType": "application/jsonl",
                "description": "JSON Lines: one item a line (blank lines skipped); line n is items[n - 1].",
            },
            "defaults": {
                "type": "string",
                "contentMediaType": "application/json",
                "description": "A JSON object of the JSON body's other fields (the defaults, callback_url).",
            },
        },
    }
    batch = {"$ref": "#/components/schemas/Batch"}
    batch_id = [{"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    form_csrf_header = [
        {
            "name": CSRF_HEADER,
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "Required with keys off on a form upload; any value.",
        }
    ]
    voice_fields = {
        "name": {
            "type": "string",
            "minLength": 1,
            "maxLength": 100,
            "pattern": visible_character(),
            "description": (
                "Unique. Control and invisible characters and surrounding spaces are dropped, as from tags and job "
                "texts; something must be left. maxLength counts the name as sent. An OpenAI voice name "
                f"({', '.join(OPENAI_VOICE_SEEDS)}) only an admin key may give: 403 naming name otherwise."
            ),
        },
        "tags": {
            "type": "array",
            "items": {
                "type": "string",
                "maxLength": 64,
                "description": "Stored lower-case; at most 64 characters as sent and as stored.",
            },
        },
        "description": {"type": ["string", "null"], "maxLength": 2000},
        "gender": {"type": ["string", "null"], "maxLength": 20},
        "age": {"type": ["string", "null"], "maxLength": 20},
        "rating": {"type": "integer", "minimum": 0, "maximum": 5},
        "favourite": {"type": "boolean"},
    }
    new_voice = {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "oneOf": [{"required": ["seed"]}, {"required": ["spk_emb"]}, {"required": ["mix"]}],
        "properties": {
            **voice_fields,
            "seed": {"type": "integer", "minimum": 0, "maximum": MAX_SEED},
            "spk_emb": _EMBEDDING,
            "mix": _BLEND_PARTS,
        },
    }
    kind = {
        "type": "string",
        "enum": list(VoiceKind.ALL),
        "description": (
            "What the voice is made of: a seed (and the embedding drawn from it), an embedding, a reference clip "
            "(its speaker sample and words: spk_smp, txt_smp), or a blend of other voices (mix)."
        ),
    }
    # An exported voice is made again from what its kind is made of; kind, when given, must say so.
    exported_voice = {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        # One kind's fields, and none of another's (a seed is an embedding's, null or absent elsewhere).
        "oneOf": [
            {
                "required": ["seed", "spk_emb"],
                "properties": {"kind": {"const": VoiceKind.SEED}, "seed": {"type": "integer"}},
                "not": {"anyOf": [{"required": ["mix"]}, {"required": ["spk_smp"]}, {"required": ["txt_smp"]}]},
            },
            {
                "required": ["spk_emb"],
                "properties": {"kind": {"const": VoiceKind.EMBEDDING}, "seed": {"type": "null"}},
                "not": {"anyOf": [{"required": ["mix"]}, {"required": ["spk_smp"]}, {"required": ["txt_smp"]}]},
            },
            {
                "required": ["spk_smp", "txt_smp"],
                "properties": {"kind": {"const": VoiceKind.CLIP}},
                "not": {"anyOf": [{"required": ["seed"]}, {"required": ["spk_emb"]}, {"required": ["mix"]}]},
            },
            {
                "required": ["mix"],
                "properties": {"kind": {"const": VoiceKind.BLEND}},
                "not": {
                    "anyOf": [
                        {"required": ["seed"]},
                        {"required": ["spk_emb"]},
                        {"required": ["spk_smp"]},
                        {"required": ["txt_smp"]},
                    ]
                },
            },
        ],
        "properties": {
            **voice_fields,
            "kind": kind,
            "seed": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_SEED},
            "spk_emb": _EMBEDDING,
            "spk_smp": _SPEAKER_SAMPLE,
            "txt_smp": _TRANSCRIPT,
            "mix": {
                **_BLEND_PARTS,
                "description": (
                    f"{_BLEND_PARTS['description']} Catalog voices are named: the names of this catalog or of the "
                    "voices imported with it (a 422 naming mix for a name that is neither). A worker mixes it here."
                ),
            },
        },
    }
    voice = {"$ref": "#/components/schemas/Voice"}
    job = {"$ref": "#/components/schemas/Job"}
    timeline_entry = {"$ref": "#/components/schemas/TimelineEntry"}
    # Only with keys on are voices owned: with keys off anyone may change any voice.
    owner_only = {"403": _error(403, _NOT_THE_OWNER)} if keys_required else {}
    # Only with keys on are there admin keys: with keys off anyone may give any name.
    name_reserved = {"403": _error(403, f"{_RESERVED_NAME}, or {_ERROR_MEANINGS[403]}")} if keys_required else {}
    renamed = {"403": _error(403, f"{_RESERVED_NAME}, or {_NOT_THE_OWNER}")} if keys_required else {}
    job_id = [{"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    voice_id = [{"name": "voice_id", "in": "path", "required": True, "schema": {"type": "integer"}}]
    description = {
        "openapi": "3.1.0",
        "info": {"title": "chattts-farm", "version": "1", "description": "ChatTTS speech synthesis farm"},
        "paths": {
            "/api/jobs": {
                "post": {
                    "summary": "Submit a synthesis job",
                    "requestBody": _json_body(job_request),
                    "responses": {
                        "202": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "id": {"type": "string"},
                                    "status": {"type": "string"},
                                    "status_url": {"type": "string"},
                                    "audio_url": {"type": "string"},
                                    "stream_url": {"type": "string"},
                                },
                            },
                            "accepted",
                        ),
                        **_errors(400, 413, 422),
                        "503": _error(503, _QUEUE_FULL),
                    },
                },
                "get": {
                    "summary": "The caller's recent jobs",
                    "parameters": [
                        {"name": "status", "in": "query", "schema": {"type": "string", "enum": list(JobStatus.ALL)}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
                    ],
                    "responses": {
                        "200": _json({"type": "object", "properties": {"jobs": {"type": "array", "items": job}}}),
                        **_errors(400, 503),
                    },
                },
            },
            "/api/jobs/{job_id}": {
                "get": {
                    "summary": "A job's status",
                    "parameters": job_id,
                    "responses": {"200": _json(job), **_errors(404, 503)},
                },
                "delete": {
                    "summary": "Cancel a job",
                    "parameters": job_id,
                    "responses": {"200": _json(job), **_errors(404, 503)},
                },
            },
            "/api/jobs/{job_id}/audio": {
                "get": {
                    "summary": "A finished job's audio",
                    "description": (
                        "Streamed from the audio store. A Range header of one byte range gets 206 with those "
                        "bytes (a suffix longer than the audio is all of it; If-Range honoured with a strong "
                        "ETag or a date); If-None-Match and If-Modified-Since get 304 and a failed If-Match 412 "
                        "where the store keeps an ETag and a write time (file and S3 stores)."
                    ),
                    "parameters": job_id,
                    "responses": {
                        "200": {
                            "description": "the audio",
                            "content": {f"audio/{kind}": {} for kind in ("wav", "flac", "ogg", "mpeg")},
                        },
                        "206": {
                            "description": "the byte range asked for (Content-Range says which)",
                            "content": {f"audio/{kind}": {} for kind in ("wav", "flac", "ogg", "mpeg")},
                        },
                        "304": {"description": "the client's copy (If-None-Match, If-Modified-Since) is current"},
                        **_errors(404, 409, 410, 412, 416, 503),
                    },
                },
            },
            "/api/jobs/{job_id}/stream": {
                "get": {
                    "summary": "A job's audio as it is made (flac whole at the end)",
                    "parameters": [
                        *job_id,
                        {"name": "format", "in": "query", "schema": {"type": "string", "enum": list(STREAM_FORMATS)}},
                    ],
                    "responses": {
                        "200": {
                            "description": "the audio, sent as it is made",
                            "content": {mime: {} for mime in STREAM_MIME_TYPES.values()},
                        },
                        **_errors(400, 404, 409, 410, 503, 504),
                        # A listener is a waiting call: the bound (web.waiting) holds with keys off too.
                        "429": _error(429, _TOO_MANY_WAITING),
                    },
                },
            },
            "/api/jobs/{job_id}/captions": {
                "get": {
                    "summary": "A finished job's captions",
                    "description": (
                        "One cue per segment of the job's text (its caption: the text as sent, control tags "
                        "left out), from the segment's start to its end in the audio (the result's timeline: "
                        "counted in the audio's samples, the silences before, between and after segments included: "
                        "pauses, and SSML breaks). Sentence-level: "
                        "ChatTTS's audio says nothing of where its words fall. 409 until the job is done."
                    ),
                    "parameters": [
                        *job_id,
                        {"name": "format", "in": "query", "schema": {"type": "string", "enum": ["vtt", "srt"]}},
                    ],
                    "responses": {
                        "200": {
                            "description": "the captions, WebVTT or SubRip",
                            "content": {"text/vtt": {}, "application/x-subrip": {}},
                        },
                        **_errors(400, 404, 409, 503),
                    },
                },
            },
            "/api/batches": {
                "post": {
                    "summary": "Submit up to 10,000 jobs at once, all or none",
                    "description": (
                        "A JSON body, or a multipart/form-data upload of the items as a JSON Lines file (with "
                        f"keys off, such a form must carry the {CSRF_HEADER} header, any value). The items are "
                        "bulk jobs unless they say otherwise. Its status, answered here and at its status_url, "
                        "counts its items by status; its archive_url is a zip of the finished items' audio."
                    ),
                    "parameters": form_csrf_header,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": batch_request},
                            "multipart/form-data": {"schema": batch_upload},
                        },
                    },
                    "responses": {
                        "202": _json(batch, "accepted: every item queued"),
                        **_errors(400, 422),
                        "403": _error(
                            403,
                            f"a form upload without {CSRF_HEADER} with keys off"
                            + (f"; or {_ERROR_MEANINGS[403]}" if keys_required else ""),
                        ),
                        "413": _error(413, "the body is larger than CHATTTS_FARM_MAX_BATCH_BYTES"),
                        "503": _error(503, _QUEUE_FULL),
                    },
                },
            },
            "/api/batches/{batch_id}": {
                "get": {
                    "summary": "A batch's status: its items counted by status, its progress, each item",
                    "parameters": [
                        *batch_id,
                        {
                            "name": "items",
                            "in": "query",
                            "schema": {"type": "string", "enum": ["all", "none"], "default": "all"},
                            "description": "none: the counts and progress without the items, for watching a "
                            "large batch.",
                        },
                    ],
                    "responses": {"200": _json(batch), **_errors(400, 404, 503)},
                },
                "delete": {
                    "summary": "Cancel every unfinished item of a batch",
                    "description": "The batch ends cancelled, unless every item had ended already.",
                    "parameters": batch_id,
                    "responses": {"200": _json(batch), **_errors(404, 503)},
                },
            },
            "/api/batches/{batch_id}/archive": {
                "get": {
                    "summary": "A zip of every done item's audio, and manifest.json",
                    "description": (
                        "Streamed as it is written. Each done item's audio is named by its custom_id, else its "
                        "place (zero-padded), with its format's extension (a custom_id that is another item's place "
                        "makes the second of the two <name>~<its place>). manifest.json: batch_id, and for each "
                        "item its place (item), custom_id, job_id, status, duration_s, error and file (null for "
                        "an item not done, or whose audio has expired). Asked for before every item has ended, it "
                        "holds those done so far."
                    ),
                    "parameters": batch_id,
                    "responses": {
                        "200": {"description": "the zip", "content": {"application/zip": {}}},
                        **_errors(404, 503),
                        "429": _error(429, _TOO_MANY_WAITING),
                    },
                },
            },
            "/api/voices": {
                "get": {
                    "summary": "Find voices",
                    "parameters": [
                        {
                            "name": "tag",
                            "in": "query",
                            "schema": {"type": "array", "items": {"type": "string"}},
                            "style": "form",
                            "explode": True,
                        },
                        {
                            "name": "q",
                            "in": "query",
                            "schema": {"type": "string"},
                            "description": "Text the name or the description holds, matched literally (no wildcards).",
                        },
                        {"name": "kind", "in": "query", "schema": kind},
                    ],
                    "responses": {
                        "200": _json({"type": "object", "properties": {"voices": {"type": "array", "items": voice}}}),
                        **_errors(400),
                    },
                },
                "post": {
                    "summary": "Add a voice from a seed, an embedding or a blend (mix), or from a reference clip",
                    "description": "A JSON body makes a voice of a speaker embedding; a multipart/form-data body "
                    "uploads a reference clip (audio) with its words (transcript), which a worker encodes into "
                    "ChatTTS's speaker sample before the voice is stored (kind clip). With keys off, such a form "
                    f"must carry the {CSRF_HEADER} header (any value): no cross-site form can send one.",
                    "parameters": form_csrf_header,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": new_voice},
                            "multipart/form-data": {"schema": _CLIP_FORM},
                        },
                    },
                    "responses": {
                        "201": _json(voice, "created"),
                        **_errors(400, 409, 422, 503),
                        "403": _error(
                            403,
                            f"a form upload without {CSRF_HEADER} with keys off"
                            + (f"; or {_RESERVED_NAME}, or {_ERROR_MEANINGS[403]}" if keys_required else ""),
                        ),
                        "413": _error(413, f"{_ERROR_MEANINGS[413]}; a clip's form past {MAX_CLIP_BYTES // 10**6} MB"),
                    },
                },
            },
            "/api/voices/{voice_id}": {
                "get": {
                    "summary": "A voice",
                    "parameters": voice_id,
                    "responses": {"200": _json(voice), **_errors(404)},
                },
                "patch": {
                    "summary": "Edit a voice",
                    "parameters": voice_id,
                    "requestBody": _json_body(
                        {"type": "object", "additionalProperties": False, "properties": voice_fields}
                    ),
                    "responses": {"200": _json(voice), **_errors(400, 404, 409, 413), **renamed},
                },
                "delete": {
                    "summary": "Delete a voice",
                    "parameters": voice_id,
                    "responses": {"204": {"description": "deleted"}, **_errors(404), **owner_only},
                },
            },
            "/api/voices/workshop": {
                "post": {
                    "summary": "Speak one sentence in new random voices and in voices named, all submitted together "
                    "(one GPU batch)",
                    "description": (
                        "The jobs speak text (default: a sample sentence) in each of voices, in order, then each in"
                        " a voice of a fresh random seed (count of them: 6 by default, none by default when voices"
                        " are named); keep the ones you like with POST /api/voices/from-job/{job_id}. All or none"
                        " are accepted: the queue's caps and the key's quota count every one."
                    ),
                    "requestBody": _json_body(
                        {
                            "type": "object",
                            "properties": {
                                "text": text,
                                "voices": {"type": "array", "maxItems": 16, "items": _VOICE_ARG},
                                "count": {"type": "integer", "minimum": 1, "maximum": 16},
                            },
                            "additionalProperties": False,
                        }
                    ),
                    "responses": {
                        "202": _json(
                            {"type": "object", "properties": {"jobs": {"type": "array", "items": job}}},
                            "the jobs, on their way",
                        ),
                        **_errors(400, 413, 422),
                        "503": _error(503, _QUEUE_FULL),
                    },
                },
            },
            "/api/voices/{voice_id}/preview": {
                "post": {
                    "summary": "The caller's preview job of the voice, generated once for each key and kept",
                    "parameters": voice_id,
                    "responses": {
                        "200": _json(job, "the kept preview, done"),
                        "202": _json(job, "the preview, on its way"),
                        **_errors(404),
                        "503": _error(503, _QUEUE_FULL),
                    },
                },
            },
            "/api/voices/from-job/{job_id}": {
                "post": {
                    "summary": "Keep the voice a job used",
                    "parameters": job_id,
                    "requestBody": _json_body(
                        {
                            "type": "object",
                            "required": ["name"],
                            "additionalProperties": False,
                            "properties": voice_fields,
                        }
                    ),
                    "responses": {"201": _json(voice, "created"), **_errors(400, 404, 409, 413, 503), **name_reserved},
                },
            },
            "/api/voices/export": {
                "get": {
                    "summary": "All voices as JSON, each as import takes it",
                    "responses": {"200": _json({"type": "array", "items": exported_voice})},
                }
            },
            "/api/ops": {
                "get": {
                    "summary": "Live workers and queue depths (the ops page's data)",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {"workers": {"type": "array"}, "queues": {"type": "object"}},
                            }
                        ),
                        **_errors(503),
                    },
                }
            },
            "/api/ops/series": {
                "get": {
                    "summary": "The farm's last 15 minutes on one time axis (the ops page's charts)",
                    "description": (
                        "One point every step_s seconds (t, Unix seconds): audio seconds and jobs finished per"
                        " second, latency and first-chunk latency p50/p95 over the minute before (from a job's"
                        " arrival in its worker), each queue's depth, and each GPU worker's memory (MiB),"
                        " fragmentation and utilisation (0..1, null without NVML). null: nothing was measured."
                    ),
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "step_s": {"type": "integer"},
                                    "t": {"type": "array", "items": {"type": "number"}},
                                    "audio_s_per_s": {"type": "array"},
                                    "jobs_per_s": {"type": "array"},
                                    "latency": {"type": "object"},
                                    "first_chunk": {"type": "object"},
                                    "queues": {"type": "object"},
                                    "gpus": {"type": "object"},
                                },
                            }
                        ),
                        **_errors(503),
                    },
                }
            },
            "/api/openapi.json": {
                "get": {"summary": "This description", "responses": {"200": _json({"type": "object"})}}
            },
            "/api/voices/import": {
                "post": {
                    "summary": "Add exported voices (existing names are skipped; all or none are added)",
                    "requestBody": _json_body({"type": "array", "items": exported_voice}),
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "added": {"type": "array", "items": {"type": "string"}},
                                    "skipped": {"type": "array", "items": {"type": "string"}},
                                },
                            }
                        ),
                        **_errors(400, 413, 422, 503),
                        **name_reserved,
                    },
                }
            },
            "/v1/audio/voices": {
                "get": {
                    "summary": "The voice names /v1/audio/speech takes: OpenAI's, then the catalog's (Kokoro-FastAPI's "
                    "shape)",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["voices"],
                                "properties": {
                                    "voices": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["id", "name"],
                                            "properties": {
                                                "id": {"type": "string", "description": "what to send as voice"},
                                                "name": {"type": "string"},
                                            },
                                        },
                                    }
                                },
                            }
                        )
                    },
                }
            },
            "/v1/audio/speech": {
                "post": {
                    "summary": "OpenAI-compatible speech",
                    "requestBody": _json_body(
                        {
                            "type": "object",
                            "required": ["input", "voice"],
                            "properties": {
                                "model": {"type": "string"},
                                "input": text,
                                "voice": {
                                    **_VOICE_ARG,
                                    "description": f"{_VOICE_ARG['description']} A blend may also be written as "
                                    "Kokoro-FastAPI writes one: alloy(2)+nova(1) (a weight left out is 1), unless a "
                                    "catalog voice has that name.",
                                },
                                "response_format": {
                                    "type": "string",
                                    "enum": ["mp3", "opus", "flac", "wav", "pcm"],
                                },
                                "speed": {"type": "number", "minimum": 0.25, "maximum": 4},
                            },
                        }
                    ),
                    "responses": {
                        "200": {"description": "the audio"},
                        **_errors(400, 413, 422, 502, 504),
                        "503": _error(503, _QUEUE_FULL),
                        # The bound on waiting calls (web.waiting) holds with keys off too.
                        "429": _error(429, _TOO_MANY_WAITING),
                    },
                },
            },
        },
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": {"type": "string"}, "field": {"type": "string"}},
                },
                "Voice": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "kind": kind,
                        "seed": {"type": ["integer", "null"]},
                        "spk_emb": {"type": ["string", "null"], "description": "Null for a clip voice alone."},
                        "spk_smp": {"type": ["string", "null"], "description": "A clip voice's speaker sample."},
                        "txt_smp": {"type": ["string", "null"], "description": "A clip voice's words."},
                        "mix": {
                            "type": ["array", "null"],
                            "description": (
                                "A blend's parts (null for other kinds): a catalog voice by its name and voice_id "
                                "while it is in the catalog, any other part (or one deleted) as the seed or "
                                "embedding mixed."
                            ),
                            "items": {
                                "type": "object",
                                "required": ["voice", "weight"],
                                "properties": {
                                    "voice": {"type": ["integer", "string"]},
                                    "weight": {"type": "number"},
                                    "voice_id": {"type": "integer"},
                                },
                            },
                        },
                        **voice_fields,
                        "editable": {
                            "type": "boolean",
                            "description": "Whether the caller may change and delete the voice: its owner or an "
                            "admin key may (anyone, with keys off); every key may read and speak it.",
                        },
                        "owner": {
                            "type": ["string", "null"],
                            "description": "The name of the API key that made the voice (null with keys off, or "
                            "for voices made before voices had owners).",
                        },
                    },
                },
                "TimelineEntry": {
                    "type": "object",
                    "required": ["index", "text", "start_s", "end_s"],
                    "properties": {
                        "index": {"type": "integer", "description": "The segment's place in the text, from 0."},
                        "text": {
                            "type": "string",
                            "description": "Its text as sent, control tags left out (SSML's: the words said, a "
                            "sub's alias and a say-as's reading among them).",
                        },
                        "start_s": {"type": "number", "description": "Where its audio starts, in seconds."},
                        "end_s": {
                            "type": "number",
                            "description": "Where its audio ends; silence follows (a pause, or an SSML break's).",
                        },
                    },
                },
                "Batch": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "status": {
                            "type": "string",
                            "enum": list(BatchStatus.ALL),
                            "description": "running while an item has not ended; then done, or cancelled when the "
                            "batch was (DELETE).",
                        },
                        "size": {"type": "integer"},
                        "counts": {
                            "type": "object",
                            "properties": {status: {"type": "integer"} for status in JobStatus.ALL},
                        },
                        "progress": {"type": "number", "description": "the share of its items' work done, 0 to 1"},
                        "created_at": {"type": "string"},
                        "finished_at": {"type": ["string", "null"]},
                        "cancelled_at": {"type": ["string", "null"]},
                        "status_url": {"type": "string"},
                        "archive_url": {"type": "string"},
                        "callback": {**callback, "description": "The batch's callback, as a job's is."},
                        "items": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "item": {"type": "integer", "description": "its place in the batch, from 0"},
                                    "custom_id": {"type": ["string", "null"]},
                                    "job_id": {"type": "string"},
                                    "status": {"type": "string", "enum": list(JobStatus.ALL)},
                                    "progress": {"type": "number"},
                                    "error": {"type": ["string", "null"]},
                                    "duration_s": {"type": ["number", "null"]},
                                    "status_url": {"type": "string"},
                                    "audio_url": {"type": "string"},
                                },
                            },
                        },
                    },
                },
                "Job": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "status": {"type": "string", "enum": list(JobStatus.ALL)},
                        "progress": {"type": "number"},
                        "error": {"type": ["string", "null"]},
                        "result": {
                            "type": ["object", "null"],
                            "description": "A done job's result: its audio's description, and where each "
                            "segment of its text lies in the audio (timeline).",
                            "properties": {
                                "duration_s": {"type": "number"},
                                "timeline": {"type": ["array", "null"], "items": timeline_entry},
                                "captions_url": {"type": "string"},
                            },
                        },
                        "status_url": {"type": "string"},
                        "audio_url": {"type": "string"},
                        "callback": callback,
                    },
                },
            }
        },
    }
    if keys_required:
        description["components"]["securitySchemes"] = {"bearer": _BEARER}
        description["security"] = [{"bearer": []}]
        _require_keys(description["paths"])
    return description


@bp.get("/openapi.json")
def openapi():
    settings = current_app.config["SETTINGS"]
    return openapi_description(
        settings.max_text_chars, keys_required=settings.require_api_key, callbacks=bool(settings.callback_secret)
    )
