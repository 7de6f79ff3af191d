"""What the farm is doing now, as Redis holds it: the workers alive and the jobs waiting in each queue.

Workers publish their health to Redis every few seconds (see worker.runtime); queue depths are the
lengths of the Redis lists Celery queues in.
"""

from __future__ import annotations

import json

from chattts_farm import redis_keys
from chattts_farm.contract import JOB_QUEUES, queue_of_worker
from web import backends


def workers() -> list[dict]:
    client = backends.current().redis
    keys = sorted(client.scan_iter(match=redis_keys.heartbeat("*")))
    reports = [json.loads(raw) for raw in client.mget(keys) if raw] if keys else []
    return sorted(reports, key=lambda report: report["worker"])


def queue_depths(known_workers: list[dict]) -> dict[str, int]:
    names = [*JOB_QUEUES] + sorted({queue_of_worker(report["worker"]) for report in known_workers})
    client = backends.current().redis
    return {name: int(client.llen(name)) for name in names}
