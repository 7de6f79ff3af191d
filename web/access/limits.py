"""Per-key limits: requests a minute (one budget for reads, one for changes, where a request that makes
several jobs counts each of them) and a daily quota of audio seconds. They count in Redis, so they hold
across every web process; over a limit is a 429 with Retry-After.

The quota is reserved at submit, not merely checked: a job holds its expected audio (the workers' own
length rule, :mod:`chattts_farm.speech_length`) against its key's quota for the day it was submitted, so
a burst of submissions cannot pass the quota before any of them finishes. When the job finishes its
reservation is settled once: a done job is charged its real duration instead, a failed or cancelled one
gives it back. Reserving and settling are Redis scripts, atomic across threads and web processes, and a
reservation is per job: settling it again charges nothing.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from flask import current_app
from redis.commands.core import Script
from redis.exceptions import RedisError

from chattts_farm import redis_keys
from chattts_farm.settings import Settings
from web import backends
from web.errors import too_many_requests
from web.models import ApiKey, Job, db

logger = logging.getLogger(__name__)

SECONDS_PER_DAY = 86_400
# A day's counts outlive the day: a job submitted before midnight is settled against it after midnight.
QUOTA_COUNTS_TTL_S = 2 * SECONDS_PER_DAY
# When only jobs still running stand in the way, their end frees the quota: retry soon, not at midnight.
RUNNING_JOBS_RETRY_AFTER_S = 30

# The counters of a minute outlive it, so that a request at its end still finds its count.
RATE_COUNTER_TTL_S = 120

# KEYS: a minute's counter of changes. ARGV: the jobs to count, the budget, the counter's lifetime.
# Counts them all if they fit in the budget, else none; answers 1 if counted.
_COUNT_JOBS = """
if tonumber(redis.call('GET', KEYS[1]) or '0') + tonumber(ARGV[1]) > tonumber(ARGV[2]) then
    return 0
end
redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: the day's charged seconds, the day's reservations (job id -> seconds).
# ARGV: the quota, the counts' lifetime, then each job's id and expected seconds, all reserved or none.
# Answers {1 if reserved else 0, seconds charged, seconds reserved by other jobs}.
_RESERVE = """
local charged = tonumber(redis.call('GET', KEYS[1]) or '0')
local reserved = 0
for _, seconds in ipairs(redis.call('HVALS', KEYS[2])) do
    reserved = reserved + tonumber(seconds)
end
local asked = 0
for i = 4, #ARGV, 2 do
    asked = asked + tonumber(ARGV[i])
end
local fits = charged + reserved + asked <= tonumber(ARGV[1])
if fits then
    for i = 3, #ARGV, 2 do
        redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    end
    redis.call('EXPIRE', KEYS[2], ARGV[2])
end
return {fits and 1 or 0, tostring(charged), tostring(reserved)}
"""

# KEYS: as for _RESERVE. ARGV: the job id, the seconds to charge (0 gives the reservation back), the
# counts' lifetime. Only the call that removes the reservation charges: a job is settled once.
_SETTLE = """
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then
    return 0
end
if tonumber(ARGV[2]) > 0 then
    redis.call('INCRBYFLOAT', KEYS[1], ARGV[2])
    redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return 1
"""


def count_request(api_key: ApiKey, settings: Settings, *, reading: bool) -> None:
    """Count this request against its key's budget for the minute; 429 once it is spent."""
    per_minute = settings.read_rate_limit_per_minute if reading else settings.rate_limit_per_minute
    counter = _rate_counter("read" if reading else "change", api_key)
    pipeline = backends.current().redis.pipeline()
    pipeline.incr(counter)
    pipeline.expire(counter, RATE_COUNTER_TTL_S)
    count = pipeline.execute()[0]
    if count > per_minute:
        what = "reads" if reading else "requests that change something"
        raise too_many_requests(f"more than {per_minute} {what} a minute with this key", _seconds_to_next_minute())


def count_jobs(api_key: ApiKey | None, jobs: int) -> None:
    """Count a request that makes ``jobs`` jobs as that many changes against its key's budget for the
    minute, all or none: the request counted itself (:func:`count_request`), its other jobs count now, and
    when they do not all fit it is a 429 and nothing more is counted. Keys off: no budget."""
    if api_key is None or jobs <= 1:
        return
    per_minute = current_app.config["SETTINGS"].rate_limit_per_minute
    if not _script(_COUNT_JOBS)(
        keys=[_rate_counter("change", api_key)], args=[jobs - 1, per_minute, RATE_COUNTER_TTL_S]
    ):
        raise too_many_requests(
            f"these {jobs} jobs would pass the {per_minute} jobs and other changes a minute of this key",
            _seconds_to_next_minute(),
        )


def reserve_audio(api_key: ApiKey | None, submitted_at: datetime, seconds_of_jobs: dict[str, float]) -> None:
    """Hold each job's expected seconds (job id -> seconds) of the key's quota, for jobs about to be
    submitted together, all or none; 429 when the seconds charged and held that day leave no room for
    them all. Keys off: no quota."""
    if api_key is None:
        return
    quota = current_app.config["SETTINGS"].daily_audio_quota_s
    reserved, charged, held = _script(_RESERVE)(
        keys=_day_counts(api_key, submitted_at),
        args=[quota, QUOTA_COUNTS_TTL_S, *[value for pair in seconds_of_jobs.items() for value in pair]],
    )
    if not reserved:
        charged, held, seconds = float(charged), float(held), sum(seconds_of_jobs.values())
        retry_after = _seconds_to_midnight() if charged + seconds > quota else RUNNING_JOBS_RETRY_AFTER_S
        these = "this job needs" if len(seconds_of_jobs) == 1 else f"these {len(seconds_of_jobs)} jobs need"
        raise too_many_requests(
            f"{these} about {seconds:.1f} s of the daily audio quota of {quota} s: "
            f"{charged:.1f} s are used today and {held:.1f} s are held by jobs not yet finished",
            retry_after,
        )


def settle_audio(charges: list[tuple[Job, float]]) -> None:
    """Settle finished jobs' reservations, each charged its ``seconds`` of audio instead (0 gives it back);
    one round trip for them all.

    When Redis cannot be reached the reservations stand, counting the jobs' expected seconds until their
    day's counts expire; that is logged, and the caller's answer goes on.
    """
    settle = _script(_SETTLE)
    pipeline = backends.current().redis.pipeline(transaction=False)
    for job, seconds in charges:
        api_key = db.session.get(ApiKey, job.api_key_id) if job.api_key_id is not None else None
        if api_key is not None:
            settle(
                keys=_day_counts(api_key, job.created_at), args=[job.id, seconds, QUOTA_COUNTS_TTL_S], client=pipeline
            )
    try:
        pipeline.execute()
    except RedisError as error:
        logger.warning("job %s, ...: audio could not be settled with its key's quota: %s", charges[0][0].id, error)


def _script(source: str) -> Script:
    return backends.current().redis.register_script(source)


def _day_counts(api_key: ApiKey, submitted_at: datetime) -> list[str]:
    """The Redis keys of a key's seconds charged and reserved for the day (UTC) a job was submitted."""
    day = f"{submitted_at:%Y%m%d}"
    return [redis_keys.audio_quota(api_key.key_hash, day), redis_keys.audio_quota_reservations(api_key.key_hash, day)]


def _rate_counter(kind: str, api_key: ApiKey) -> str:
    return redis_keys.rate_counter(kind, api_key.key_hash, int(time.time() // 60))


def _seconds_to_next_minute() -> int:
    return 60 - int(time.time()) % 60


def _seconds_to_midnight() -> int:
    return SECONDS_PER_DAY - int(time.time()) % SECONDS_PER_DAY
