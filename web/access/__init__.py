"""Who may use the farm: the check every request passes, and the key it stands for.

With ``CHATTTS_FARM_REQUIRE_API_KEY`` on, /api and /v1 take a key as ``Authorization: Bearer <key>``
or from a browser session signed in with one on the pages; the pages themselves need that sign-in.
A session is a cookie the browser sends by itself, so every state-changing request it authenticates
must also carry the page's CSRF token (the ``X-CSRF-Token`` header, or the form's ``csrf_token``).
A bearer key is never sent by a browser on its own and needs no token. With keys off, the API is
anonymous and reads only ``application/json`` bodies, which no cross-site form can send.

The parts: :mod:`.api_keys` (made, revoked, looked up), :mod:`.sessions` (sign-in, kept in Redis, and
CSRF), :mod:`.limits` (per-key rate limits and the daily audio quota, reserved at submit, counted in Redis
so they hold across every web process) and :mod:`.secret_key` (the key signing session cookies).
"""

from __future__ import annotations

from flask import Flask, current_app, g, redirect, request, url_for

from web.access import api_keys, limits, secret_key, sessions
from web.errors import ApiError
from web.models import ApiKey

PUBLIC_PATHS = ("/api/openapi.json",)
PROTECTED_PREFIXES = ("/api/", "/v1/")
# Pages behind sign-in when keys are on; the sign-in page itself is open.
PAGE_ENDPOINTS_OPEN = {"pages.sign_in", "pages.favicon", "static"}
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


def current_key() -> ApiKey | None:
    """The key of this request (None when keys are off)."""
    return g.get("api_key")


def refuse_cross_site_forms() -> None:
    """Refuse a form body (an upload) that a cross-site page could have sent. With keys on, a session's
    requests carry the CSRF token already (checked in :func:`init_app`'s ``authenticate``) and a bearer key
    is never sent by a browser on its own. With keys off the API relies on reading only JSON, which no
    cross-site form sends: a form must carry the ``X-CSRF-Token`` header instead (the pages send their
    token; any value does), which no cross-site form can send either, nor a cross-site script without
    the farm's leave (CORS: a header of its own asks first, and the farm never allows it)."""
    if not current_app.config["SETTINGS"].require_api_key and not request.headers.get(sessions.CSRF_HEADER):
        raise ApiError(
            403,
            f"with keys off a form upload must carry the {sessions.CSRF_HEADER} header (any value; the pages send"
            " theirs), which no cross-site form can send",
            sessions.CSRF_HEADER,
        )


def _signed_in_key() -> ApiKey | None:
    """The live key this browser's session stands for, if any."""
    key_id = sessions.signed_in_key_id()
    return api_keys.find_key_by_id(key_id) if key_id is not None else None


def _is_page() -> bool:
    return request.blueprint == "pages" and request.endpoint not in PAGE_ENDPOINTS_OPEN


def init_app(app: Flask) -> None:
    app.secret_key = secret_key.get_or_create(app.config["SETTINGS"])
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax")
    app.session_interface = sessions.SessionCookie()

    @app.context_processor
    def page_access() -> dict:
        return {"csrf_token": sessions.csrf_token, "signed_in_key": current_key()}

    @app.before_request
    def authenticate():
        settings = app.config["SETTINGS"]
        if not settings.require_api_key:
            return None
        if _is_page():
            g.api_key = _signed_in_key()
            if g.api_key is None:
                return redirect(url_for("pages.sign_in", next=request.full_path.rstrip("?")))
            return None
        if request.path in PUBLIC_PATHS or not request.path.startswith(PROTECTED_PREFIXES):
            return None
        reading = request.method in SAFE_METHODS
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, key = header.partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                raise ApiError(401, "send the API key as Authorization: Bearer <key>", "Authorization")
            api_key = api_keys.find_key(key)
            if api_key is None:
                raise ApiError(401, "the API key is unknown or revoked", "Authorization")
        else:
            api_key = _signed_in_key()
            if api_key is None:
                raise ApiError(
                    401,
                    "an API key is required: send Authorization: Bearer <key>, or sign in on the pages",
                    "Authorization",
                )
            if not reading and not sessions.csrf_ok(request.headers.get(sessions.CSRF_HEADER)):
                raise ApiError(
                    403, "the CSRF token is missing or wrong: reload the page and try again", sessions.CSRF_HEADER
                )
        g.api_key = api_key
        limits.count_request(api_key, settings, reading=reading)
        return None
