"""One place that turns errors into JSON answers: ``{"error": "...", "field": "..."}``."""

from __future__ import annotations

import logging

from flask import Flask, jsonify, request
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError
from werkzeug.exceptions import HTTPException, ServiceUnavailable

from chattts_farm.contract import InvalidRequest

logger = logging.getLogger(__name__)

JSON_PREFIXES = ("/api/", "/v1/")
QUEUE_UNREACHABLE = "the job queue (Redis) could not be reached: try again shortly"


class ApiError(Exception):
    """An error answer: HTTP status, a message a user can act on, and the field it concerns."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers: dict[str, str] = {}


def try_again_later(status: int, message: str, retry_after_s: int, field: str | None = None) -> ApiError:
    """An error answer telling the caller when to try again (``Retry-After``, in seconds)."""
    error = ApiError(status, message, field)
    error.headers = {"Retry-After": str(max(1, retry_after_s))}
    return error


def too_many_requests(message: str, retry_after_s: int) -> ApiError:
    """A 429 telling the caller when to try again; every limit is per key, so it names Authorization."""
    return try_again_later(429, message, retry_after_s, "Authorization")


def _answer(status: int, message: str, field: str | None):
    body = {"error": message}
    if field is not None:  # "" is a field too: a JSON key may be empty
        body["field"] = field
    return jsonify(body), status


def init_app(app: Flask) -> None:
    @app.errorhandler(InvalidRequest)
    def invalid_request(error: InvalidRequest):
        return _answer(400, str(error), error.field)

    @app.errorhandler(ApiError)
    def api_error(error: ApiError):
        body, status = _answer(error.status, error.message, error.field)
        return body, status, error.headers

    # Redis away (restarting, say) is the farm's outage, not a bug: a 503 the caller can retry, never a
    # 500. Job rows stay in the database, and every read catches up once Redis is back.
    @app.errorhandler(RedisError)
    @app.errorhandler(OperationalError)
    def queue_unreachable(error: Exception):
        logger.warning("%s %s: Redis could not be reached: %s", request.method, request.path, error)
        if not request.path.startswith(JSON_PREFIXES):
            return ServiceUnavailable(QUEUE_UNREACHABLE)
        return _answer(503, QUEUE_UNREACHABLE, None)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException):
        if not request.path.startswith(JSON_PREFIXES):
            return error  # pages get Werkzeug's plain HTML error page
        field = "body" if error.code == 413 else None
        body, status = _answer(error.code or 500, error.description or error.name, field)
        # Werkzeug's own headers say what the error means: a 405's Allow lists the methods the path takes.
        headers = {name: value for name, value in error.get_headers() if name.lower() != "content-type"}
        return body, status, headers
