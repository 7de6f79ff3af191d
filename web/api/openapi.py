"""The OpenAPI 3.1 description of the JSON API, served at /api/openapi.json."""

from __future__ import annotations

from flask import current_app

from chattts_farm.contract import FORMATS, MAX_SEED
from web.api import bp
from web.models import JobStatus

_ERROR = {"$ref": "#/components/schemas/Error"}
_VOICE_ARG = {
    "description": "A catalog voice name, an integer seed, or a ChatTTS speaker-embedding string.",
    "oneOf": [{"type": "integer", "minimum": 0, "maximum": MAX_SEED}, {"type": "string", "minLength": 1}],
}


def _errors(*codes: int) -> dict:
    return {str(code): {"description": "error", "content": {"application/json": {"schema": _ERROR}}} for code in codes}


def _json(schema: dict, description: str = "ok") -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def openapi_description(max_text_chars: int) -> dict:
    text = {
        "type": "string",
        "minLength": 1,
        "maxLength": max_text_chars,
        "description": (
            "Plain text (SSML is refused). ChatTTS reads Latin letters and Chinese characters: other characters "
            "are dropped, control and invisible characters first, and text with nothing left to speak is refused."
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
        },
    }
    voice_fields = {
        "name": {"type": "string", "minLength": 1, "maxLength": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 64}},
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
        "oneOf": [{"required": ["seed"]}, {"required": ["spk_emb"]}],
        "properties": {
            **voice_fields,
            "seed": {"type": "integer", "minimum": 0, "maximum": MAX_SEED},
            "spk_emb": {"type": "string", "description": "A ChatTTS speaker-embedding string."},
        },
    }
    exported_voice = {
        "type": "object",
        "required": ["name", "spk_emb"],
        "additionalProperties": False,
        "properties": {
            **new_voice["properties"],
            "seed": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_SEED},
        },
    }
    voice = {"$ref": "#/components/schemas/Voice"}
    job = {"$ref": "#/components/schemas/Job"}
    job_id = [{"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    voice_id = [{"name": "voice_id", "in": "path", "required": True, "schema": {"type": "integer"}}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "chattts-farm", "version": "1", "description": "ChatTTS speech synthesis farm"},
        "paths": {
            "/api/jobs": {
                "post": {
                    "summary": "Submit a synthesis job",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": job_request}}},
                    "responses": {
                        "202": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "id": {"type": "string"},
                                    "status": {"type": "string"},
                                    "status_url": {"type": "string"},
                                    "audio_url": {"type": "string"},
                                },
                            },
                            "accepted",
                        ),
                        **_errors(400, 413, 422, 503),
                    },
                },
                "get": {
                    "summary": "Recent jobs",
                    "parameters": [
                        {"name": "status", "in": "query", "schema": {"type": "string", "enum": list(JobStatus.ALL)}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
                    ],
                    "responses": {
                        "200": _json({"type": "object", "properties": {"jobs": {"type": "array", "items": job}}}),
                        **_errors(400),
                    },
                },
            },
            "/api/jobs/{job_id}": {
                "get": {
                    "summary": "A job's status",
                    "parameters": job_id,
                    "responses": {"200": _json(job), **_errors(404)},
                },
                "delete": {
                    "summary": "Cancel a job",
                    "parameters": job_id,
                    "responses": {"200": _json(job), **_errors(404)},
                },
            },
            "/api/jobs/{job_id}/audio": {
                "get": {
                    "summary": "A finished job's audio",
                    "parameters": job_id,
                    "responses": {
                        "200": {
                            "description": "the audio",
                            "content": {f"audio/{kind}": {} for kind in ("wav", "flac", "ogg", "mpeg")},
                        },
                        **_errors(404, 409, 410),
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
                        {"name": "q", "in": "query", "schema": {"type": "string"}},
                    ],
                    "responses": {
                        "200": _json({"type": "object", "properties": {"voices": {"type": "array", "items": voice}}})
                    },
                },
                "post": {
                    "summary": "Add a voice from a seed or an embedding",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": new_voice}}},
                    "responses": {"201": _json(voice, "created"), **_errors(400, 409, 413, 503)},
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
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"type": "object", "additionalProperties": False, "properties": voice_fields}
                            }
                        },
                    },
                    "responses": {"200": _json(voice), **_errors(400, 404, 409, 413)},
                },
                "delete": {
                    "summary": "Delete a voice",
                    "parameters": voice_id,
                    "responses": {"204": {"description": "deleted"}, **_errors(404)},
                },
            },
            "/api/voices/{voice_id}/preview": {
                "post": {
                    "summary": "The voice's preview job, generated once and kept",
                    "parameters": voice_id,
                    "responses": {
                        "200": _json(job, "the kept preview, done"),
                        "202": _json(job, "the preview, on its way"),
                        **_errors(404, 503),
                    },
                },
            },
            "/api/voices/from-job/{job_id}": {
                "post": {
                    "summary": "Keep the voice a job used",
                    "parameters": job_id,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["name"],
                                    "additionalProperties": False,
                                    "properties": voice_fields,
                                }
                            }
                        },
                    },
                    "responses": {"201": _json(voice, "created"), **_errors(400, 404, 409, 413)},
                },
            },
            "/api/voices/export": {
                "get": {"summary": "All voices as JSON", "responses": {"200": _json({"type": "array"})}}
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
            "/api/openapi.json": {
                "get": {"summary": "This description", "responses": {"200": _json({"type": "object"})}}
            },
            "/api/voices/import": {
                "post": {
                    "summary": "Add exported voices (existing names are skipped)",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"type": "array", "items": exported_voice}}},
                    },
                    "responses": {"200": _json({"type": "object"}), **_errors(400, 413)},
                }
            },
            "/v1/audio/speech": {
                "post": {
                    "summary": "OpenAI-compatible speech",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["input", "voice"],
                                    "properties": {
                                        "model": {"type": "string"},
                                        "input": text,
                                        "voice": _VOICE_ARG,
                                        "response_format": {
                                            "type": "string",
                                            "enum": ["mp3", "opus", "flac", "wav", "pcm"],
                                        },
                                        "speed": {"type": "number", "minimum": 0.25, "maximum": 4},
                                    },
                                }
                            }
                        },
                    },
                    "responses": {"200": {"description": "the audio"}, **_errors(400, 413, 502, 504)},
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
                        "seed": {"type": ["integer", "null"]},
                        "spk_emb": {"type": "string"},
                        **voice_fields,
                    },
                },
                "Job": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "status": {"type": "string", "enum": list(JobStatus.ALL)},
                        "progress": {"type": "number"},
                        "error": {"type": ["string", "null"]},
                        "result": {"type": ["object", "null"]},
                        "status_url": {"type": "string"},
                        "audio_url": {"type": "string"},
                    },
                },
            }
        },
    }


@bp.get("/openapi.json")
def openapi():
    return openapi_description(current_app.config["SETTINGS"].max_text_chars)
