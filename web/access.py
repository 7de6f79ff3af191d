"""Who may use the API: API keys (stored hashed), per-key rate limits and daily audio quotas.

Limits count in Redis, so they hold across every web process. Keys are required on /api and /v1
when ``CHATTTS_FARM_REQUIRE_API_KEY`` is on, given as ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import datetime, timezone

from flask import Flask, current_app, g, request

from web import farm
from web.errors import ApiError
from web.models import ApiKey, db, utcnow

KEY_PREFIX = "cf_"
PUBLIC_PATHS = ("/api/openapi.json",)
PROTECTED_PREFIXES = ("/api/", "/v1/")
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


def init_app(app: Flask) -> None:
    @app.before_request
    def authenticate():
        settings = app.config["SETTINGS"]
        if not settings.require_api_key or request.path in PUBLIC_PATHS \
                or not request.path.startswith(PROTECTED_PREFIXES):
            return None
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(401, "an API key is required: send Authorization: Bearer <key>", "Authorization")
        api_key = db.session.execute(db.select(ApiKey).where(ApiKey.key_hash == hash_key(key.strip()))
                                     ).scalar_one_or_none()
        if api_key is None or api_key.revoked_at is not None:
            raise ApiError(401, "the API key is unknown or revoked", "Authorization")
        g.api_key = api_key
        _count_request(api_key, settings.rate_limit_per_minute)
        return None


def _count_request(api_key: ApiKey, per_minute: int) -> None:
    window = int(time.time() // 60)
    counter = f"chattts:rate:{api_key.key_hash[:16]}:{window}"
    client = farm.client().redis
    pipeline = client.pipeline()
    pipeline.incr(counter)
    pipeline.expire(counter, 120)
    count = pipeline.execute()[0]
    if count > per_minute:
        raise _too_many(f"more than {per_minute} requests a minute with this key", 60 - int(time.time()) % 60)


def _too_many(message: str, retry_after_s: int) -> ApiError:
    error = ApiError(429, message, "Authorization")
    error.headers = {"Retry-After": str(max(1, retry_after_s))}
    return error


def _quota_key(api_key: ApiKey) -> str:
    # Named by the key's hash, not its row id: ids repeat across databases sharing one Redis.
    return f"chattts:quota:{api_key.key_hash[:16]}:{datetime.now(timezone.utc):%Y%m%d}"


def _seconds_to_midnight() -> int:
    return SECONDS_PER_DAY - int(time.time()) % SECONDS_PER_DAY
