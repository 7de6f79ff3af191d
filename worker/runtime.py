"""What a worker process holds for its whole life: its engine process's client, a Redis client, its streams.

Started once per process, from the Celery ``worker_init`` signal (see :mod:`worker.tasks`), before
the worker consumes any job: the engine process loads and warms up the model first. Torch-free: the
model lives in the engine process (see worker.engine_client).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass, field

import redis
from celery import Celery
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from chattts_farm import audio_store, ops_series, redis_keys
from chattts_farm.audio_store import AudioStore
from chattts_farm.contract import JOB_QUEUES, queue_of_worker
from chattts_farm.settings import Settings
from worker import failover
from worker.encoders import encoder_pool
from worker.engine_client import EngineClient, Job
from worker.failover import HeldMessages
from worker.stream_publisher import StreamPublisher

logger = logging.getLogger(__name__)

# Seconds of Redis outage (a restart, say) the worker's own writes wait out: one retry a second at most.
REDIS_OUTAGE_S = 120
# A warm shutdown waits for the jobs the worker holds, and storing their progress, audio and results
# waits for Redis: for as long as it is away (see worker.celery_app). Once Redis has been unreachable
# this long into a shutdown, the worker exits without them. Nothing is lost: they are acknowledged
# only when done, so Redis hands them out again (see Settings.visibility_timeout_s).
SHUTDOWN_REDIS_GRACE_S = 10


@dataclass
class WorkerRuntime:
    settings: Settings
    hostname: str
    engine: EngineClient
    redis: redis.Redis
    streams: StreamPublisher
    audio_store: AudioStore
    celery_app: Celery
    instance: str
    held_messages: HeldMessages
    encoders: Executor | None  # where results in costly formats are encoded (see worker.results)
    # Jobs finished since the last heartbeat took them: (audio seconds, latency s, first-chunk latency s).
    finished: deque = field(default_factory=deque)
    jobs_done: int = 0  # by this process (the engine's own count is its Celery processes' together)
    audio_seconds_done: float = 0.0

    def job_finished(self, handle: Job, duration_s: float) -> None:
        """Note a finished job for the next sample of the ops page's history; latencies count from the
        job's arrival in this worker."""
        now = time.monotonic()
        first_chunk = None if handle.first_audio_at is None else handle.first_audio_at - handle.submitted_at
        self.finished.append((duration_s, now - handle.submitted_at, first_chunk))
        self.jobs_done += 1
        self.audio_seconds_done += duration_s

    def beat(self) -> None:
        """Publish this worker's health to Redis every few seconds, for the ops page and /metrics, and a
        sample of what it did since the beat before to its history (see chattts_farm.ops_series); then
        put back on their queues the messages of workers that stopped beating (see worker.failover)."""
        key = redis_keys.heartbeat(self.hostname)
        while True:
            try:
                health = {**self.health(), "instance": self.instance, "heartbeat": time.time()}
                self.redis.set(key, json.dumps(health), ex=redis_keys.HEARTBEAT_TTL_S)
                self.held_messages.keep_alive()
                ops_series.record(self.redis, self.hostname, self.sample(health))
            except redis.RedisError as error:
                logger.warning("heartbeat not published: %s", error)
            try:
                failover.restore_lapsed(self.redis, self.celery_app, self.instance)
            except Exception:  # noqa: BLE001 - the beat goes on; dead workers' jobs come back after the visibility timeout
                logger.exception("could not restore the messages of lapsed workers")
            time.sleep(redis_keys.HEARTBEAT_INTERVAL_S)

    def sample(self, health: dict) -> ops_series.Sample:
        """The jobs finished since the last sample, the GPU now and the depth of this worker's queues."""
        taken = [self.finished.popleft() for _ in range(len(self.finished))]
        queues = (*JOB_QUEUES, queue_of_worker(self.hostname))
        pipeline = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipeline.llen(queue)
        gpu = health["gpu"]
        return ops_series.Sample(
            at=time.time(),
            jobs=len(taken),
            audio_s=round(sum(audio for audio, _, _ in taken), 3),
            latencies_s=[round(latency, 4) for _, latency, _ in taken],
            first_chunks_s=[round(first, 4) for _, _, first in taken if first is not None],
            queues=dict(zip(queues, pipeline.execute(), strict=True)),
            gpu=None if gpu is None else {name: gpu[name] for name in ops_series.GPU_FIELDS},
        )

    def exit_once_redis_stays_away(self) -> None:
        """While the worker shuts down: end the process when Redis stays unreachable (SHUTDOWN_REDIS_GRACE_S)."""
        # One quick try each time, not the patient retries of the worker's own client.
        probe = redis.Redis.from_url(
            self.settings.redis_url, socket_connect_timeout=1, socket_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        unreachable_since = None
        while True:
            try:
                probe.ping()
                unreachable_since = None
            except redis.RedisError as error:
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since >= SHUTDOWN_REDIS_GRACE_S:
                    logger.warning(
                        "stopping, and Redis is unreachable (%s) for %d s: exiting without the jobs still held; "
                        "they are not acknowledged, and Redis hands them out again",
                        error,
                        SHUTDOWN_REDIS_GRACE_S,
                    )
                    os._exit(os.EX_TEMPFAIL)
            time.sleep(1)

    def health(self) -> dict:
        """Model kind, device, dtype, GPU name and memory, and how busy this worker is."""
        engine = self.engine
        return {
            "worker": self.hostname,
            "pid": os.getpid(),
            "engine_pid": engine.engine_pid,
            "engine_restarts": engine.restarts,
            "host": socket.gethostname(),
            "model": engine.model_info["kind"],
            "model_info": engine.model_info,
            "batch_jobs": self.settings.max_jobs_in_flight,  # the health answer keeps its published name
            **engine.stats,
            "jobs_done": self.jobs_done,
            "audio_seconds_done": round(self.audio_seconds_done, 3),
            "gpu": engine.gpu,
        }


_runtime: WorkerRuntime | None = None


def start(settings: Settings, hostname: str, is_revoked, celery_app, log_level: int = logging.INFO) -> WorkerRuntime:
    """Start the engine process (it loads and warms up the model, logging at ``log_level``); once per process."""
    global _runtime
    client = redis_client(settings)
    _warn_unless_noeviction(client)
    engine = EngineClient(settings, queue_of_worker(hostname), is_revoked=is_revoked, log_level=log_level)
    engine.start()
    publisher = StreamPublisher(client, ttl_s=settings.stream_ttl_s, max_entries=settings.stream_max_entries)
    store = audio_store.from_settings(settings, client)
    instance = failover.instance_name()
    held_messages = HeldMessages(client, hostname, instance, ttl_s=settings.visibility_timeout_s)
    encoders = encoder_pool(settings)
    _runtime = WorkerRuntime(
        settings, hostname, engine, client, publisher, store, celery_app, instance, held_messages, encoders
    )
    threading.Thread(target=_runtime.beat, name="heartbeat", daemon=True).start()
    logger.info("worker %s ready: model %s", hostname, engine.model_info)
    return _runtime


def watch_shutdown() -> None:
    """The worker was asked to stop: bound how long it waits for an unreachable Redis, and for an engine
    process that another Celery process of its GPU started and that has gone."""
    if _runtime is not None:
        _runtime.engine.stopping = True
        threading.Thread(target=_runtime.exit_once_redis_stays_away, name="shutdown-watch", daemon=True).start()


def current() -> WorkerRuntime:
    if _runtime is None:
        raise RuntimeError("the worker runtime is not started: run workers with `chattts-farm worker`")
    return _runtime


def redis_client(settings: Settings) -> redis.Redis:
    """The worker's own Redis client, for audio and heartbeats.

    Every job thread may store audio at once: a blocking pool makes a thread wait for a connection
    rather than fail when they all finish together. A finished job's audio write rides out a Redis
    restart (retried for about REDIS_OUTAGE_S) instead of failing a job whose audio is made.
    """
    retry = Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=REDIS_OUTAGE_S)
    return redis.Redis(
        connection_pool=redis.BlockingConnectionPool.from_url(
            settings.redis_url,
            max_connections=settings.max_jobs_in_flight + 8,
            timeout=60,
            retry=retry,
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        )
    )


def _warn_unless_noeviction(client: redis.Redis) -> None:
    """Redis must never evict queued jobs or results to make room: that would lose jobs silently."""
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.ResponseError:  # CONFIG may be disabled on managed Redis
        return
    if policy != "noeviction":
        logger.warning(
            "!!! Redis maxmemory-policy is %r; set it to noeviction, or Redis may drop queued jobs "
            "and results under memory pressure !!!",
            policy,
        )
