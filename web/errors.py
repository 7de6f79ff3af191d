"""One place that turns errors into JSON answers: ``{"error": "...", "field": "..."}``."""

from __future__ import annotations

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from worker.contract import InvalidRequest

JSON_PREFIXES = ("/api/", "/v1/")


class ApiError(Exception):
    """An error answer: HTTP status, a message a user can act on, and the field it concerns."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers: dict[str, str] = {}


def _answer(status: int, message: str, field: str | None):
    body = {"error": message}
    if field:
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

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException):
        if not request.path.startswith(JSON_PREFIXES):
            return error  # pages get Werkzeug's plain HTML error page
        field = "body" if error.code == 413 else None
        return _answer(error.code or 500, error.description or error.name, field)
