"""Back-pressure: a job is admitted only while the farm's backlog (jobs accepted, not yet started) is under
``CHATTTS_FARM_MAX_QUEUED_JOBS`` and, with keys on, its key's under ``CHATTTS_FARM_MAX_QUEUED_JOBS_PER_KEY``
and under its fair share of the farm's cap. Past any of them it is refused (503 for the farm's, 429 for a
key's, with ``Retry-After``) before anything of it exists: no row, no message, no quota reserved.

The fair share: once the backlog reaches half the farm's cap, a key may hold at most
``cap // (keys with jobs waiting, its own included, + 1)`` waiting jobs (at least one). The ``+ 1`` is room
for a key yet to come; below half, whatever the others hold, the room left is more than any share.

Admission is one Redis script, atomic across threads and web processes, so two submissions at the edge
cannot both pass. Its counts are derived from the truth or lapse by themselves:

- the backlog is the queue lists' lengths plus the jobs admitted and not yet sent
  (:mod:`chattts_farm.backlog`); an admission lasts until its message is sent, or lapses
  (``ADMISSION_S``) when its web process dies first; a cancelled job's message is taken out of its list
  (:func:`withdraw`);
- a key's waiting jobs are a set of its admitted job ids; once the set is full, the jobs whose task has a
  state in the result backend (started, finished, failed, revoked) are dropped from it before it is judged
  full. A job that ends (cancelled, say) leaves it at once; an admission not followed by its message lapses,
  and every entry lapses with the results (``CHATTTS_FARM_RESULT_TTL_S``);
- the keys with jobs waiting are an index of their sets (:data:`chattts_farm.redis_keys.QUEUING_KEYS`),
  read only while the backlog is past half the cap: a key counts while its oldest entry has no state, and
  the entries that have one are dropped on the way (each once), a set left empty leaving the index.
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
KEY_FULL, FARM_FULL, OVER_FAIR_SHARE = 1, 2, 3

# KEYS: the key's queued jobs (job id -> when its entry lapses), the index of keys queuing, then
# backlog.waiting_keys(). ARGV: the farm's cap, the key's cap (0: keys off, no cap), ADMISSION_S, the
# result backend's key prefix, the results' lifetime (no entry outlives it), then the job ids, all
# admitted or none (a batch's thousands in one call: each is added in the loop, never unpacked). Task state
# keys and other keys' sets are read by names made or found here, not passed as keys: the farm's Redis is
# one server, never a cluster. Answers {0 (admitted), KEY_FULL, FARM_FULL or OVER_FAIR_SHARE; the limit that
# refused; the keys with jobs waiting, when the fair share was reckoned}. A contended admission reads
# every queuing key's oldest entry: about a millisecond for a thousand keys.
_ADMIT = (
    backlog.WAITING_JOBS_LUA
    + """
local function drop_started(queued, state_prefix)
    for _, job_id in ipairs(redis.call('ZRANGE', queued, 0, -1)) do
        if redis.call('EXISTS', state_prefix .. job_id) == 1 then
            redis.call('ZREM', queued, job_id)
        end
    end
end

local function has_waiting_jobs(queued, state_prefix, now)
    redis.call('ZREMRANGEBYSCORE', queued, '-inf', now)
    while true do
        local oldest = redis.call('ZRANGE', queued, 0, 0)[1]
        if oldest == nil then
            return false
        end
        if redis.call('EXISTS', state_prefix .. oldest) == 0 then
            return true
        end
        redis.call('ZREM', queued, oldest)
    end
end

local function other_keys_waiting(index, own, state_prefix, now)
    redis.call('ZREMRANGEBYSCORE', index, '-inf', now)
    local count = 0
    for _, queued in ipairs(redis.call('ZRANGE', index, 0, -1)) do
        if queued ~= own then
            if has_waiting_jobs(queued, state_prefix, now) then
                count = count + 1
            else
                redis.call('ZREM', index, queued)
            end
        end
    end
    return count
end

local farm_cap = tonumber(ARGV[1])
local jobs = #ARGV - 5
local waiting = waiting_jobs(KEYS[3], {unpack(KEYS, 4)})
if waiting + jobs > farm_cap then
    return {2, farm_cap, 0}
end
local now = tonumber(redis.call('TIME')[1])
local lapses = now + tonumber(ARGV[3])
local key_cap = tonumber(ARGV[2])
if key_cap > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    local limit, keys = key_cap, 0
    if waiting * 2 >= farm_cap then
        keys = other_keys_waiting(KEYS[2], KEYS[1], ARGV[4], now) + 1
        limit = math.min(key_cap, math.max(1, math.floor(farm_cap / (keys + 1))))
    end
    if redis.call('ZCARD', KEYS[1]) + jobs > limit then
        drop_started(KEYS[1], ARGV[4])
        if redis.call('ZCARD', KEYS[1]) + jobs > limit then
            return {limit < key_cap and 3 or 1, limit, keys}
        end
    end
    for i = 6, #ARGV do
        redis.call('ZADD', KEYS[1], lapses, ARGV[i])
    end
    redis.call('EXPIRE', KEYS[1], ARGV[5])
    local indexed_until = lapses + tonumber(ARGV[5])
    redis.call('ZADD', KEYS[2], indexed_until, KEYS[1])
    redis.call('EXPIREAT', KEYS[2], indexed_until)
end
for i = 6, #ARGV do
    redis.call('ZADD', KEYS[3], lapses, ARGV[i])
end
return {0, 0, 0}
"""
)


def admit(api_key: ApiKey | None, *job_ids: str) -> None:
    """Admit jobs about to be recorded and sent, all or none, or refuse them: 503 when the farm's backlog
    has no room for them all, 429 when their key's has none, or they would pass the key's fair share of
    the farm's."""
    settings = current_app.config["SETTINGS"]
    answer, limit, keys = backends.current().redis.register_script(_ADMIT)(
        keys=[_queued_jobs(api_key), redis_keys.QUEUING_KEYS, *backlog.waiting_keys()],
        args=[
            settings.max_queued_jobs,
            settings.max_queued_jobs_per_key if api_key is not None else 0,
            ADMISSION_S,
            backends.current().celery.backend.task_keyprefix,
            settings.result_ttl_s,
            *job_ids,
        ],
    )
    these = "this job" if len(job_ids) == 1 else f"these {len(job_ids)} jobs"
    if answer == FARM_FULL:
        logger.info("%d job(s) from %s refused: the farm queues at most %d", len(job_ids), job_ids[0], limit)
        raise try_again_later(
            503,
            f"the farm queues at most {limit} jobs waiting to start, and has no room for {these}: try again shortly",
            RETRY_AFTER_S,
        )
    if answer == KEY_FULL:
        raise too_many_requests(
            f"one key may have at most {limit} jobs waiting to start, and this one has no room for {these}:"
            " try again once some have started",
            RETRY_AFTER_S,
        )
    if answer == OVER_FAIR_SHARE:
        logger.info("job %s refused: its key holds its fair share, %d, of %d keys queuing", job_ids[0], limit, keys)
        raise too_many_requests(
            f"{these} would pass this key's fair share of the farm's queue, {limit} jobs waiting to start, while"
            f" {keys} keys have jobs waiting (at most {settings.max_queued_jobs} in all): try again once some"
            " have started",
            RETRY_AFTER_S,
        )


def withdraw(*job_ids: str) -> None:
    """Cancelled jobs' messages leave their queue lists, where they still wait: the farm's backlog stops
    counting them at once, and no worker takes them. Redis away here leaves the messages for a worker to
    drop (the tasks are revoked)."""
    try:
        withdrawn = backlog.withdraw(backends.current().redis, *job_ids)
        logger.info("%d of %d cancelled job(s) (%s, ...) taken out of the queue", withdrawn, len(job_ids), job_ids[0])
    except RedisError as error:
        logger.warning("job %s, ...: messages could not be taken out of the queue: %s", job_ids[0], error)


def sent(api_key: ApiKey | None, *job_ids: str) -> None:
    """The jobs' messages are in their queues: the queues count them now, and their key's entries last as
    long as results do. Redis away here only shortens the entries' lives; the jobs are sent, the answer
    goes on."""
    client = backends.current().redis
    try:
        pipeline = client.pipeline()
        pipeline.zrem(redis_keys.ADMISSIONS, *job_ids)
        if api_key is not None:
            lapses = time.time() + current_app.config["SETTINGS"].result_ttl_s
            pipeline.zadd(_queued_jobs(api_key), dict.fromkeys(job_ids, lapses), xx=True)
        pipeline.execute()
    except RedisError as error:
        logger.warning("job %s, ...: admissions could not be marked sent: %s", job_ids[0], error)


def release(api_key: ApiKey | None, *job_ids: str) -> None:
    """The jobs no longer wait (they ended, or were refused after their admission): they free their places
    at once. Redis away here leaves the places to lapse by themselves."""
    client = backends.current().redis
    try:
        pipeline = client.pipeline()
        pipeline.zrem(redis_keys.ADMISSIONS, *job_ids)
        if api_key is not None:
            pipeline.zrem(_queued_jobs(api_key), *job_ids)
        pipeline.execute()
    except RedisError as error:
        logger.warning("job %s, ...: places in the queue could not be released: %s", job_ids[0], error)


def _queued_jobs(api_key: ApiKey | None) -> str:
    # Keys off: the script is given the set's name but no cap, and never touches it.
    return redis_keys.queued_jobs(api_key.key_hash if api_key is not None else "anonymous")
