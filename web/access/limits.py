"""Per-key limits: requests a minute (one budget for reads, one for changes) and a daily quota of audio
seconds. They count in Redis, so they hold across every web process; over a limit is a 429 with
Retry-After."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from flask import current_app

from chattts_farm import redis_keys
from chattts_farm.settings import Settings
from web import backends
from web.errors import ApiError
from web.models import ApiKey, db

SECONDS_PER_DAY = 86_400


def count_request(api_key: ApiKey, settings: Settings, *, reading: bool) -> None:
    """Count this request against its key's budget for the minute; 429 once it is spent."""
    per_minute = settings.read_rate_limit_per_minute if reading else settings.rate_limit_per_minute
    window = int(time.time() // 60)
    counter = redis_keys.rate_counter("read" if reading else "change", api_key.key_hash, window)
    client = backends.current().redis
    pipeline = client.pipeline()
    pipeline.incr(counter)
    pipeline.expire(counter, 120)
    count = pipeline.execute()[0]
    if count > per_minute:
        what = "reads" if reading else "requests that change something"
        raise _too_many(f"more than {per_minute} {what} a minute with this key", 60 - int(time.time()) % 60)


def check_quota(api_key: ApiKey | None) -> None:
    """429 when the key has used today's audio seconds (nothing to check when keys are off)."""
    if api_key is None:
        return
    used = float(backends.current().redis.get(_quota_key(api_key)) or 0)
    quota = current_app.config["SETTINGS"].daily_audio_quota_s
    if used >= quota:
        raise _too_many(f"the daily audio quota of {quota} s is used up", _seconds_to_midnight())


def record_audio(key_id: int | None, seconds: float) -> None:
    """Count a finished job's audio against its key's quota for today."""
    api_key = db.session.get(ApiKey, key_id) if key_id is not None else None
    if api_key is not None and seconds:
        quota_key = _quota_key(api_key)
        client = backends.current().redis
        client.incrbyfloat(quota_key, seconds)
        client.expire(quota_key, 2 * SECONDS_PER_DAY)


def _too_many(message: str, retry_after_s: int) -> ApiError:
    error = ApiError(429, message, "Authorization")
    error.headers = {"Retry-After": str(max(1, retry_after_s))}
    return error


def _quota_key(api_key: ApiKey) -> str:
    return redis_keys.audio_quota(api_key.key_hash, f"{datetime.now(UTC):%Y%m%d}")


def _seconds_to_midnight() -> int:
    return SECONDS_PER_DAY - int(time.time()) % SECONDS_PER_DAY
