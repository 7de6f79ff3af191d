"""Server-rendered pages: the form, job status, recent jobs, the voice catalog, operations and sign-in."""

from flask import Blueprint

bp = Blueprint("pages", __name__)

from web.pages import routes  # noqa: E402,F401 - registers the views on bp
