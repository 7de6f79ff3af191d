"""The farm's backlog: jobs accepted but not yet started, and whether the farm takes more.

A job waits as its task message in a queue list (``tts``, or Celery's default ``celery``) until a
worker with a free thread takes it; a worker takes one only when it can hold it (prefetch 1), so the
lists' lengths are the jobs waiting, wherever they were sent from. To them are added the jobs a web
process has admitted and not yet sent (:data:`chattts_farm.redis_keys.ADMISSIONS`, each with a
deadline, so a process that dies between the two leaves nothing behind for long). The count is read
from the truth: nothing to drift, nothing to correct. A cancelled job's message stays in its list
until a worker takes it and drops it at once.

The web refuses jobs past ``CHATTTS_FARM_MAX_QUEUED_JOBS`` (503 with ``Retry-After``). A Celery caller
sends past the web, so it should look first::

    from chattts_farm.backlog import read_backlog

    backlog = read_backlog(redis_url=URL)
    if not backlog.accepting:
        ...  # back off: backlog.waiting jobs wait already, backlog.max_queued_jobs at most

Torch-free and Celery-free: only ``redis`` (and only when called).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chattts_farm import redis_keys
from chattts_farm.contract import CELERY_DEFAULT_QUEUE, DEFAULT_QUEUE
from chattts_farm.settings import Settings

WAITING_QUEUES = (DEFAULT_QUEUE, CELERY_DEFAULT_QUEUE)

# A Lua function of the jobs waiting now, for every script that counts them (so that the web's check
# and its admission are one atomic step): the admissions' set, then the queue lists. Admissions past
# their deadline (Redis's own clock) are dropped first.
WAITING_JOBS_LUA = """
local function waiting_jobs(admissions, queues)
    redis.call('ZREMRANGEBYSCORE', admissions, '-inf', redis.call('TIME')[1])
    local waiting = redis.call('ZCARD', admissions)
    for _, queue in ipairs(queues) do
        waiting = waiting + redis.call('LLEN', queue)
    end
    return waiting
end
"""
_COUNT_WAITING = WAITING_JOBS_LUA + "return waiting_jobs(KEYS[1], {unpack(KEYS, 2)})"


@dataclass(frozen=True)
class Backlog:
    waiting: int
    max_queued_jobs: int

    @property
    def accepting(self) -> bool:
        return self.waiting < self.max_queued_jobs


def waiting_keys() -> list[str]:
    """The Redis keys :data:`WAITING_JOBS_LUA` counts: the admissions' set first, then the queues."""
    return [redis_keys.ADMISSIONS, *WAITING_QUEUES]


def count_waiting(client: Any) -> int:
    """The jobs waiting now, on a ``redis.Redis`` client."""
    return int(client.register_script(_COUNT_WAITING)(keys=waiting_keys()))


def read_backlog(*, client: Any = None, redis_url: str | None = None, max_queued_jobs: int | None = None) -> Backlog:
    """The backlog now, against ``max_queued_jobs`` (default: ``CHATTTS_FARM_MAX_QUEUED_JOBS``, as the web
    reads it). Give a ``redis.Redis`` client, or the farm's Redis URL."""
    if client is None:
        import redis

        client = redis.Redis.from_url(redis_url or Settings.from_env().redis_url)
    if max_queued_jobs is None:
        max_queued_jobs = Settings.from_env().max_queued_jobs
    return Backlog(count_waiting(client), max_queued_jobs)
