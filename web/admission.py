"""Back-pressure: a job is admitted only while the farm's backlog (jobs accepted, not yet started) is under
``CHATTTS_FARM_MAX_QUEUED_JOBS`` and, with keys on, its key's under ``CHATTTS_FARM_MAX_QUEUED_JOBS_PER_KEY``.
Past either it is refused (503, or 429 for the key's own, with ``Retry-After``) before anything of it
exists: no row, no message, no quota reserved.

Admission is one Redis script, atomic across threads and web processes, so two submissions at the edge
cannot both pass. Its counts are derived from the truth or lapse by themselves:

- the backlog is the queue lists' lengths plus the jobs admitted and not yet sent
  (:mod:`chattts_farm.backlog`); an admission lasts until its message is sent, or lapses
  (``ADMISSION_S``) when its web process dies first;
- a key's waiting jobs are a set of its admitted job ids; once the set is full, the jobs whose task has a
  state in the result backend (started, finished, failed, revoked) are dropped from it before it is judged
  full. A job that ends (cancelled, say) leaves it at once; an admission not followed by its message lapses,
  and every entry lapses with the results (``CHATTTS_FARM_RESULT_TTL_S``).
"""

from __future__ import annotations

import logging
import time

from flask import current_app
from redis.exceptions import RedisError

from chattts_farm import backlog, redis_keys
from web import backends
from web.errors import too_many_requests, try_again_later
from web.models import ApiKey

logger = logging.getLogger(__name__)

# Longer than any submission takes between its admission and its message being sent.
ADMISSION_S = 60
# A waiting job starts within seconds once workers drain the queue: ask again soon.
RETRY_AFTER_S = 10
KEY_FULL, FARM_FULL = 1, 2

# KEYS: the key's queued jobs (job id -> when its entry lapses), then backlog.waiting_keys().
# ARGV: the job id, the farm's cap, the key's cap (0: keys off, no cap), ADMISSION_S, the result backend's
# key prefix, the results' lifetime (no entry outlives it). A task's state key is read by a name made
# here, not passed as a key: the farm's Redis is one server, never a cluster. Answers 0 (admitted),
# KEY_FULL or FARM_FULL.
_ADMIT = (
    backlog.WAITING_JOBS_LUA
    + """
if waiting_jobs(KEYS[2], {unpack(KEYS, 3)}) >= tonumber(ARGV[2]) then
    return 2
end
local now = tonumber(redis.call('TIME')[1])
local lapses = now + tonumber(ARGV[4])
local key_cap = tonumber(ARGV[3])
if key_cap > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    if redis.call('ZCARD', KEYS[1]) >= key_cap then
        for _, job_id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
            if redis.call('EXISTS', ARGV[5] .. job_id) == 1 then
                redis.call('ZREM', KEYS[1], job_id)
            end
        end
        if redis.call('ZCARD', KEYS[1]) >= key_cap then
            return 1
        end
    end
    redis.call('ZADD', KEYS[1], lapses, ARGV[1])
    redis.call('EXPIRE', KEYS[1], ARGV[6])
end
redis.call('ZADD', KEYS[2], lapses, ARGV[1])
return 0
"""
)


def admit(api_key: ApiKey | None, job_id: str) -> None:
    """Admit a job about to be recorded and sent, or refuse it: 503 when the farm's backlog is full, 429
    when its key's is."""
    settings = current_app.config["SETTINGS"]
    answer = backends.current().redis.register_script(_ADMIT)(
        keys=[_queued_jobs(api_key), *backlog.waiting_keys()],
        args=[
            job_id,
            settings.max_queued_jobs,
            settings.max_queued_jobs_per_key if api_key is not None else 0,
            ADMISSION_S,
            backends.current().celery.backend.task_keyprefix,
            settings.result_ttl_s,
        ],
    )
    if answer == FARM_FULL:
        logger.info("job %s refused: %d jobs wait already", job_id, settings.max_queued_jobs)
        raise try_again_later(
            503,
            f"the farm has {settings.max_queued_jobs} jobs waiting to start, as many as it queues: try again shortly",
            RETRY_AFTER_S,
        )
    if answer == KEY_FULL:
        raise too_many_requests(
            f"this key has {settings.max_queued_jobs_per_key} jobs waiting to start, as many as one key may queue:"
            " try again once some have started",
            RETRY_AFTER_S,
        )


def sent(api_key: ApiKey | None, job_id: str) -> None:
    """The job's message is in its queue: the queue counts it now, and its key's entry lasts as long as
    results do. Redis away here only shortens the entries' lives; the job is sent, the answer goes on."""
    client = backends.current().redis
    try:
        pipeline = client.pipeline()
        pipeline.zrem(redis_keys.ADMISSIONS, job_id)
        if api_key is not None:
            lapses = time.time() + current_app.config["SETTINGS"].result_ttl_s
            pipeline.zadd(_queued_jobs(api_key), {job_id: lapses}, xx=True)
        pipeline.execute()
    except RedisError as error:
        logger.warning("job %s: its admission could not be marked sent: %s", job_id, error)


def release(api_key: ApiKey | None, job_id: str) -> None:
    """The job no longer waits (it ended, or was refused after its admission): it frees its place at once.
    Redis away here leaves the place to lapse by itself."""
    client = backends.current().redis
    try:
        pipeline = client.pipeline()
        pipeline.zrem(redis_keys.ADMISSIONS, job_id)
        if api_key is not None:
            pipeline.zrem(_queued_jobs(api_key), job_id)
        pipeline.execute()
    except RedisError as error:
        logger.warning("job %s: its place in the queue could not be released: %s", job_id, error)


def _queued_jobs(api_key: ApiKey | None) -> str:
    # Keys off: the script is given the set's name but no cap, and never touches it.
    return redis_keys.queued_jobs(api_key.key_hash if api_key is not None else "anonymous")
