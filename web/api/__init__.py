"""The JSON API under /api."""

from flask import Blueprint

bp = Blueprint("api", __name__, url_prefix="/api")

from web.api import batches, jobs, openapi, ops, voices  # noqa: E402,F401 - registers the views on bp
