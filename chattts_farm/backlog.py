"""The farm's backlog: jobs accepted but not yet started, and whether the farm takes more.

A job waits as its task message in a queue list (``tts``, ``tts.interactive``, ``tts.bulk`` by its
priority, or Celery's default ``celery``) until a
worker with a free thread takes it; a worker takes one only when it can hold it (prefetch 1), so the
lists' lengths are the jobs waiting, wherever they were sent from. To them are added the jobs a web
process has admitted and not yet sent (:data:`chattts_farm.redis_keys.ADMISSIONS`, each with a
deadline, so a process that dies between the two leaves nothing behind for long). The count is read
from the truth: nothing to drift, nothing to correct. A cancelled job's message is taken out of its
list (:func:`withdraw`), so it stops counting at once and no worker ever sees it.

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
from chattts_farm.contract import JOB_QUEUES
from chattts_farm.settings import Settings

WAITING_QUEUES = JOB_QUEUES

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

# KEYS: the queue lists. ARGV: task ids. Takes their messages out of the lists; answers how many were
# there. A message is kombu's JSON envelope, its task id at headers.id: a cheap look at its strings finds
# the candidates, and only those are decoded, so a text (kwargsrepr) or a root_id naming an id is no
# match. The lists are read a chunk at a time (kombu pushes at the head: a recent job is found in the
# first chunks, and the search ends once every id is found), so the script holds one chunk, not a whole
# list of messages up to 10 KB each. A list that held a few is trimmed of each (LREM); one that held
# many (a batch's) is written again without them in one pass, not searched once per message. A message
# at the far end, or in no list, costs one pass over them: 30 ms at 10,000 waiting messages of 100
# characters of text (measured on a 2-core test machine; copying the messages out of the lists is
# nearly all of it), during which Redis serves nothing else; a recent job is found in 2 ms.
_WITHDRAW = """
local chunk, rewrite_past = 500, 8
local wanted, left = {}, #ARGV
for _, task_id in ipairs(ARGV) do
    wanted[task_id] = true
end

local function task_of(raw)
    for text in string.gmatch(raw, '"([^"]*)"') do
        if wanted[text] then
            local decoded, message = pcall(cjson.decode, raw)
            if decoded and type(message) == 'table' and type(message.headers) == 'table'
                    and wanted[message.headers.id] then
                return message.headers.id
            end
            return nil
        end
    end
    return nil
end

local function take_out(queue, found)
    if #found <= rewrite_past then
        for _, raw in ipairs(found) do
            redis.call('LREM', queue, 1, raw)
        end
        return
    end
    local gone, kept = {}, {}
    for _, raw in ipairs(found) do
        gone[raw] = true
    end
    for _, raw in ipairs(redis.call('LRANGE', queue, 0, -1)) do
        if not gone[raw] then
            kept[#kept + 1] = raw
        end
    end
    redis.call('DEL', queue)
    for first = 1, #kept, chunk do
        redis.call('RPUSH', queue, unpack(kept, first, math.min(first + chunk - 1, #kept)))
    end
end

local withdrawn = 0
for _, queue in ipairs(KEYS) do
    local start, found = 0, {}
    while left > 0 do
        local messages = redis.call('LRANGE', queue, start, start + chunk - 1)
        for _, raw in ipairs(messages) do
            local task_id = task_of(raw)
            if task_id then
                wanted[task_id] = nil
                left = left - 1
                found[#found + 1] = raw
            end
        end
        if #messages < chunk then
            break
        end
        start = start + chunk
    end
    take_out(queue, found)
    withdrawn = withdrawn + #found
end
return withdrawn
"""


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


def withdraw(client: Any, *task_ids: str) -> int:
    """Take waiting tasks' messages out of their queue lists (their jobs were cancelled), on a
    ``redis.Redis`` client: they stop counting as waiting at once and no worker takes them. How many were
    there: a task no list holds was taken by a worker already (revoking it is what stops it then)."""
    return int(client.register_script(_WITHDRAW)(keys=list(WAITING_QUEUES), args=list(task_ids)))


def read_backlog(*, client: Any = None, redis_url: str | None = None, max_queued_jobs: int | None = None) -> Backlog:
    """The backlog now, against ``max_queued_jobs`` (default: ``CHATTTS_FARM_MAX_QUEUED_JOBS``, as the web
    reads it). Give a ``redis.Redis`` client, or the farm's Redis URL."""
    if client is None:
        import redis

        client = redis.Redis.from_url(redis_url or Settings.from_env().redis_url)
    if max_queued_jobs is None:
        max_queued_jobs = Settings.from_env().max_queued_jobs
    return Backlog(count_waiting(client), max_queued_jobs)
