"""Who may use the farm: API keys (stored hashed), page sign-in, CSRF, rate limits and quotas.

With ``CHATTTS_FARM_REQUIRE_API_KEY`` on, /api and /v1 take a key as ``Authorization: Bearer <key>``
or from a browser session signed in with one on the pages; the pages themselves need that sign-in.
A session is a cookie the browser sends by itself, so every state-changing request it authenticates
must also carry the page's CSRF token (the ``X-CSRF-Token`` header, or the form's ``csrf_token``).
A bearer key is never sent by a browser on its own and needs no token. With keys off, the API is
anonymous and reads only ``application/json`` bodies, which no cross-site form can send.
Limits count in Redis, so they hold across every web process.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from datetime import datetime, timezone

from flask import Flask, current_app, g, redirect, request, session, url_for

from web import farm
from web.errors import ApiError
from web.models import ApiKey, db, utcnow
from worker.settings import Settings

KEY_PREFIX = "cf_"
PUBLIC_PATHS = ("/api/openapi.json",)
PROTECTED_PREFIXES = ("/api/", "/v1/")
# Pages behind sign-in when keys are on; the sign-in page itself is open.
PAGE_ENDPOINTS_OPEN = {"pages.sign_in", "static"}
PAGE_ENDPOINTS_EXTRA = {"monitoring.ops"}
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
CSRF_HEADER = "X-CSRF-Token"
CSRF_FORM_FIELD = "csrf_token"
SECONDS_PER_DAY = 86_400


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(name: str) -> str:
    """A new key for ``name``; the key itself is returned once and never stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    db.session.add(ApiKey(name=name, key_hash=hash_key(key), prefix=key[:10]))
    db.session.commit()
    return key


def revoke_key(name: str) -> bool:
    key = db.session.execute(db.select(ApiKey).where(ApiKey.name == name)).scalar_one_or_none()
    if key is None or key.revoked_at is not None:
        return False
    key.revoked_at = utcnow()
    db.session.commit()
    return True


def current_key() -> ApiKey | None:
    """The key of this request (None when keys are off)."""
    return g.get("api_key")


def record_audio(key_id: int | None, seconds: float) -> None:
    """Count a finished job's audio against its key's quota for today."""
    api_key = db.session.get(ApiKey, key_id) if key_id is not None else None
    if api_key is not None and seconds:
        quota_key = _quota_key(api_key)
        client = farm.client().redis
        client.incrbyfloat(quota_key, seconds)
        client.expire(quota_key, 2 * SECONDS_PER_DAY)


def check_quota() -> None:
    """429 when the caller's key has used today's audio seconds."""
    key = current_key()
    if key is None:
        return
    used = float(farm.client().redis.get(_quota_key(key)) or 0)
    quota = current_app.config["SETTINGS"].daily_audio_quota_s
    if used >= quota:
        raise _too_many(f"the daily audio quota of {quota} s is used up", _seconds_to_midnight())


def find_key(key: str) -> ApiKey | None:
    """The live (unrevoked) key row for a key as its holder types it."""
    return _live(db.session.execute(db.select(ApiKey).where(ApiKey.key_hash == hash_key(key.strip()))
                                    ).scalar_one_or_none())


def csrf_token() -> str:
    """This browser session's CSRF token, made on first use."""
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(32)
    return session["csrf"]


def csrf_ok(sent: str | None) -> bool:
    expected = session.get("csrf")
    return bool(expected and sent) and hmac.compare_digest(expected, sent)


def sign_in(api_key: ApiKey) -> None:
    # A fresh session (and so a fresh CSRF token): nothing set before sign-in carries over.
    session.clear()
    session["api_key_id"] = api_key.id
    csrf_token()


def sign_out() -> None:
    session.clear()


def secret_key(settings: Settings) -> str:
    """The key signing session cookies: the configured one, else one kept in the data dir so every
    web process and every restart shares it."""
    if settings.secret_key:
        return settings.secret_key
    path = settings.data_dir / "secret_key"
    if not path.exists():
        # Written aside, then linked into place: a link never half-exists, and the first process wins.
        candidate = path.with_name(f"secret_key.{os.getpid()}")
        descriptor = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(48))
        try:
            os.link(candidate, path)
        except FileExistsError:
            pass
        finally:
            candidate.unlink()
    return path.read_text().strip()


def _session_key() -> ApiKey | None:
    key_id = session.get("api_key_id")
    return _live(db.session.get(ApiKey, key_id) if isinstance(key_id, int) else None)


def _live(api_key: ApiKey | None) -> ApiKey | None:
    return api_key if api_key is not None and api_key.revoked_at is None else None


def _is_page() -> bool:
    return (request.blueprint == "pages" or request.endpoint in PAGE_ENDPOINTS_EXTRA) \
        and request.endpoint not in PAGE_ENDPOINTS_OPEN


def init_app(app: Flask) -> None:
    app.secret_key = secret_key(app.config["SETTINGS"])
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax")

    @app.context_processor
    def page_access() -> dict:
        return {"csrf_token": csrf_token, "signed_in_key": current_key()}

    @app.before_request
    def authenticate():
        settings = app.config["SETTINGS"]
        if not settings.require_api_key:
            return None
        if _is_page():
            g.api_key = _session_key()
            if g.api_key is None:
                return redirect(url_for("pages.sign_in", next=request.full_path.rstrip("?")))
            return None
        if request.path in PUBLIC_PATHS or not request.path.startswith(PROTECTED_PREFIXES):
            return None
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, key = header.partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                raise ApiError(401, "send the API key as Authorization: Bearer <key>", "Authorization")
            api_key = find_key(key)
            if api_key is None:
                raise ApiError(401, "the API key is unknown or revoked", "Authorization")
        else:
            api_key = _session_key()
            if api_key is None:
                raise ApiError(401, "an API key is required: send Authorization: Bearer <key>, "
                                    "or sign in on the pages", "Authorization")
            if request.method not in SAFE_METHODS and not csrf_ok(request.headers.get(CSRF_HEADER)):
                raise ApiError(403, "the CSRF token is missing or wrong: reload the page and try again",
                               CSRF_HEADER)
        g.api_key = api_key
        _count_request(api_key, settings)
        return None


def _count_request(api_key: ApiKey, settings: Settings) -> None:
    reading = request.method in SAFE_METHODS
    per_minute = settings.read_rate_limit_per_minute if reading else settings.rate_limit_per_minute
    window = int(time.time() // 60)
    counter = f"chattts:rate:{'read' if reading else 'change'}:{api_key.key_hash[:16]}:{window}"
    client = farm.client().redis
    pipeline = client.pipeline()
    pipeline.incr(counter)
    pipeline.expire(counter, 120)
    count = pipeline.execute()[0]
    if count > per_minute:
        what = "reads" if reading else "requests that change something"
        raise _too_many(f"more than {per_minute} {what} a minute with this key", 60 - int(time.time()) % 60)


def _too_many(message: str, retry_after_s: int) -> ApiError:
    error = ApiError(429, message, "Authorization")
    error.headers = {"Retry-After": str(max(1, retry_after_s))}
    return error


def _quota_key(api_key: ApiKey) -> str:
    # Named by the key's hash, not its row id: ids repeat across databases sharing one Redis.
    return f"chattts:quota:{api_key.key_hash[:16]}:{datetime.now(timezone.utc):%Y%m%d}"


def _seconds_to_midnight() -> int:
    return SECONDS_PER_DAY - int(time.time()) % SECONDS_PER_DAY
