"""Every Redis key the farm writes or reads beside Celery's own: one place, so web processes, workers
and outside tools agree on them. Celery's queues are Redis lists named after the queue
(:mod:`chattts_farm.contract` names those).
"""

from __future__ import annotations

AUDIO_PREFIX = "chattts:audio:"
# Each worker keeps its health report (chattts.health's answer) under this prefix + its node name,
# refreshed every few seconds and expiring when the worker is gone: the ops page and /metrics read it.
HEARTBEAT_PREFIX = "chattts:worker:"
HEARTBEAT_INTERVAL_S = 5
HEARTBEAT_TTL_S = 20
# Kombu's Redis transport keeps delivered, unacknowledged messages in this hash.
UNACKED_HASH = "unacked"


def audio(job_id: str) -> str:
    """Where a job's encoded audio waits: one key per job, so a re-run overwrites it."""
    return AUDIO_PREFIX + job_id


def heartbeat(worker_name: str) -> str:
    return HEARTBEAT_PREFIX + worker_name


def rate_counter(kind: str, key_hash: str, minute: int) -> str:
    """A key's count of requests of ``kind`` (``read`` or ``change``) in one minute since the epoch."""
    return f"chattts:rate:{kind}:{key_hash[:16]}:{minute}"


def audio_quota(key_hash: str, day: str) -> str:
    """Audio seconds a key has produced on ``day`` (YYYYMMDD, UTC). Named by the key's hash, not its
    row id: ids repeat across databases sharing one Redis."""
    return f"chattts:quota:{key_hash[:16]}:{day}"
