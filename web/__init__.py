"""The web front end: JSON API, pages and the OpenAI-compatible endpoint. Never imports torch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from flask import Flask, request
from flask_migrate import Migrate
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.middleware.proxy_fix import ProxyFix

from chattts_farm.settings import Settings
from web.errors import ApiError
from web.models import db

MULTIPART = "multipart/form-data"
MIGRATIONS = str(Path(__file__).resolve().parent.parent / "migrations")
migrate = Migrate()


def create_app(test_config: dict | None = None) -> Flask:
    """Build the app. ``test_config`` may carry ``SETTINGS`` (a :class:`Settings`) and Flask keys."""
    app = Flask(__name__)
    settings = (test_config or {}).get("SETTINGS") or Settings.from_env()
    app.config.from_mapping(
        SETTINGS=settings,
        SQLALCHEMY_DATABASE_URI=settings.database_uri,
        SQLALCHEMY_ENGINE_OPTIONS=_engine_options(settings.database_uri),
        MAX_CONTENT_LENGTH=settings.max_request_bytes,
        JSON_SORT_KEYS=False,
    )
    if test_config:
        app.config.update(test_config)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.trust_proxy:
        # Behind TLS ending at a proxy: the request is https (Secure cookies, https URLs) and comes
        # from the client the proxy names, as the proxy saw them.
        proxies = settings.trust_proxy
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies, x_host=proxies, x_port=proxies)

    db.init_app(app)
    migrate.init_app(app, db, directory=MIGRATIONS)

    from web import access, backends, errors, monitoring, openai
    from web.api import bp as api_bp
    from web.pages import bp as pages_bp

    backends.init_app(app)
    errors.init_app(app)
    access.init_app(app)
    _refuse_streamed_bodies_past_the_limit(app)
    app.register_blueprint(api_bp)
    app.register_blueprint(openai.bp)
    app.register_blueprint(pages_bp)
    app.register_blueprint(monitoring.bp)

    @app.after_request
    def security_headers(response):
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault(
            "Content-Security-Policy", "default-src 'self'; media-src 'self' blob:; frame-ancestors 'none'"
        )
        return response

    return app


def _engine_options(database_uri: str) -> dict:
    """A database server may close a pooled connection (a restart, a failover, an idle timeout): each is
    checked as it is taken, so a request does not fail on one. SQLite is a file: nothing to check."""
    return {} if database_uri.startswith("sqlite") else {"pool_pre_ping": True}


def sent_as_form() -> bool:
    """Whether the request's body is a multipart form. One without a boundary is none (a browser's always
    has one): a body in no shape the API reads, refused as the JSON it is not, never as a form."""
    return request.mimetype == MULTIPART and "boundary" in request.mimetype_params


def takes_uploads_up_to(
    limit: int | Callable[[Settings], int], field: str, message: str, mimetypes: tuple[str, ...] = (MULTIPART,)
):
    """A view taking bodies of ``mimetypes`` (uploads: multipart/form-data) larger than MAX_CONTENT_LENGTH: up
    to ``limit`` bytes (or the settings' limit that ``limit`` reads), a longer one refused with a 413 naming
    ``field``, from its Content-Length before any of it is read."""

    def mark(view):
        view.body_limit = (limit, field, message, mimetypes)
        return view

    return mark


def _refuse_streamed_bodies_past_the_limit(app: Flask) -> None:
    @app.before_request
    def read_a_streamed_body_whole():
        """A body sent without Content-Length (chunked) reaches Werkzeug as a stream it cuts at
        MAX_CONTENT_LENGTH, handing the view the cut body as if it were whole (a JSON error: a 400).
        Read it here, after authentication (Flask keeps it for the view): a byte past the limit is a 413."""
        too_large: Exception = RequestEntityTooLarge()
        body_limit = getattr(app.view_functions.get(request.endpoint), "body_limit", None)
        if body_limit is not None and request.mimetype in body_limit[3]:
            limit, field, message, _ = body_limit
            request.max_content_length = limit(app.config["SETTINGS"]) if callable(limit) else limit
            too_large = ApiError(413, message, field)
            if (request.content_length or 0) > request.max_content_length:
                raise too_large
        if request.content_length is None and request.environ.get("wsgi.input_terminated"):
            try:
                request.get_data()
            except RequestEntityTooLarge:
                raise too_large from None
            if request.environ["wsgi.input"].read(1):
                raise too_large
