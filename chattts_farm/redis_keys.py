"""Every Redis key the farm writes or reads beside Celery's own: one place, so web processes, workers
and outside tools agree on them. Celery's queues are Redis lists named after the queue
(:mod:`chattts_farm.contract` names those).
"""

from __future__ import annotations

AUDIO_PREFIX = "chattts:audio:"
STREAM_PREFIX = "chattts:stream:"
# Each worker keeps its health report (chattts.health's answer) under this prefix + its node name,
# refreshed every few seconds and expiring when the worker is gone: the ops page and /metrics read it.
# The same beat appends a sample to the worker's recent history (see chattts_farm.ops_series).
HEARTBEAT_PREFIX = "chattts:worker:"
HEARTBEAT_INTERVAL_S = 2
HEARTBEAT_TTL_S = 20
OPS_SERIES_PREFIX = "chattts:ops-series:"
# Kombu's Redis transport keeps delivered, unacknowledged messages in this hash.
UNACKED_HASH = "unacked"
# Messages a worker took off a queue and could not take as a job (not JSON, a broken envelope, an
# undecodable body, an unknown task, ...), newest first: each a JSON object {"queue", "reason", "at"
# (Unix time), "size" (characters), "message" (its text, cut at 64 KiB)}. Only the newest are kept.
DEAD_LETTERS = "chattts:dead-letters"
DEAD_LETTERS_KEPT = 1000
# Jobs a web process has admitted and not yet sent to a queue (a sorted set: job id -> the Unix time its
# admission lapses), counted with the queues as jobs waiting (see chattts_farm.backlog).
ADMISSIONS = "chattts:admissions"
# The keys that may have jobs waiting: a sorted set, a key's queued-jobs set -> the Unix time all its
# entries have lapsed by (see web.admission's fair shares).
QUEUING_KEYS = "chattts:queuing-keys"

# Held by the reconciler at work (see web.reconcile): of several web hosts' reconcilers, one at a time.
RECONCILER_LOCK = "chattts:reconciler-lock"
# The delivery tags of the messages one worker instance holds (a set), and the lock of whoever restores
# them once its heartbeat lapses (see worker.failover): prefix + worker name + ":" + instance.
HELD_MESSAGES_PREFIX = "chattts:held-messages:"
RESTORE_LOCK_PREFIX = "chattts:restoring:"


def audio(job_id: str) -> str:
    """Where a job's encoded audio waits: one key per job, so a re-run overwrites it."""
    return AUDIO_PREFIX + job_id


def stream(job_id: str) -> str:
    """The Redis stream a streaming job's audio goes to as it is made (see :mod:`chattts_farm.streams`)."""
    return STREAM_PREFIX + job_id


def delivery(job_id: str) -> str:
    """What the web has sent of a streaming job, and whether it was cancelled (a hash: ``seconds``, the
    furthest any listener got; ``cancelled``, set by a cancel): a cancel stops every listener at once and
    charges what went out (see web.delivery)."""
    return "chattts:delivery:" + job_id


def callback_attempts(record_id: str) -> str:
    """The attempts to deliver a callback (a list, oldest first, of JSON objects: ``attempt``, ``at``
    (Unix time), ``status_code``, ``error``, ``outcome`` (``delivered``, ``retrying`` or ``failed``) and
    ``retry_in_s``), written by the worker delivering it; ``record_id`` is the job's id."""
    return "chattts:callback:" + record_id


def heartbeat(worker_name: str) -> str:
    return HEARTBEAT_PREFIX + worker_name


def held_messages(worker_name: str, instance: str) -> str:
    return f"{HELD_MESSAGES_PREFIX}{worker_name}:{instance}"


def held_messages_owner(key: str) -> tuple[str, str]:
    """The worker name and instance of a :func:`held_messages` key (an instance has no colon)."""
    worker_name, instance = key.removeprefix(HELD_MESSAGES_PREFIX).rsplit(":", 1)
    return worker_name, instance


def restore_lock(worker_name: str, instance: str) -> str:
    return f"{RESTORE_LOCK_PREFIX}{worker_name}:{instance}"


def ops_series(worker_name: str) -> str:
    """A worker's samples of the last minutes, oldest first, for the ops page's charts."""
    return OPS_SERIES_PREFIX + worker_name


def rate_counter(kind: str, key_hash: str, minute: int) -> str:
    """A key's count of requests of ``kind`` (``read`` or ``change``) in one minute since the epoch."""
    return f"chattts:rate:{kind}:{key_hash[:16]}:{minute}"


def audio_quota(key_hash: str, day: str) -> str:
    """Audio seconds charged to a key for the finished jobs it submitted on ``day`` (YYYYMMDD, UTC).
    Named by the key's hash, not its row id: ids repeat across databases sharing one Redis."""
    return f"chattts:quota:{key_hash[:16]}:{day}"


def audio_quota_reservations(key_hash: str, day: str) -> str:
    """A hash of the audio seconds each unfinished job of a key, submitted on ``day``, holds against
    that day's quota: job id -> estimated seconds, until the job finishes and is settled."""
    return f"chattts:quota-reserved:{key_hash[:16]}:{day}"


def queued_jobs(key_hash: str) -> str:
    """The jobs of a key admitted and maybe not yet started (a sorted set: job id -> the Unix time the
    entry lapses), counted against ``CHATTTS_FARM_MAX_QUEUED_JOBS_PER_KEY`` (see web.admission)."""
    return f"chattts:queued:{key_hash[:16]}"


def browser_session(session_hash: str) -> str:
    """A signed-in browser session (its key's id and CSRF token), named by the SHA-256 of the session
    id its cookie carries: what Redis holds cannot be replayed as a cookie."""
    return f"chattts:session:{session_hash}"


def key_sessions(key_hash: str) -> str:
    """The browser sessions signed in with a key (a sorted set: session hash -> expiry time), so that
    revoking the key ends them all."""
    return f"chattts:key-sessions:{key_hash[:16]}"


def wait_slots(owner: str) -> str:
    """The requests of one key held open waiting for their jobs (a sorted set: slot id -> when its lease
    ends), so every web process counts them against one bound. ``owner`` is the key's hash prefix, or
    ``anonymous`` when keys are off."""
    return f"chattts:waits:{owner}"
