"""A dead worker's jobs back on their queue within seconds, not after Redis's visibility timeout.

A job's message stays unacknowledged until its job is done (late acknowledgement), and kombu's Redis
transport hands such a message out again only once it is older than the visibility timeout (twice a
job's time limit and more: half an hour by default). So a worker process that dies (a SIGKILL, a lost
host) would leave its jobs waiting that long while other GPUs idle. Instead, every worker process:

- keeps the delivery tags of the messages it holds in a Redis set of its own, named for its worker
  name and its instance (pid and start time, as its heartbeat reports them): added as a message is
  received, removed as its job returns (:class:`HeldMessages`);
- at every heartbeat, looks for the sets of instances whose heartbeat has lapsed (gone, or now another
  instance's: the supervisor restarted it) and puts exactly those messages back at the head of their
  queues through kombu's own restore, one restorer per dead instance (:func:`restore_lapsed`). A
  message acknowledged meanwhile is not in kombu's unacknowledged hash and is left alone, so a tag
  kept a moment too long restores nothing.

A worker whose heartbeat lapses while it lives (cut off from Redis for longer than the heartbeat's
TTL) would see its jobs run again elsewhere; a job that runs twice gives the same audio (same seed), and
the later result overwrites the earlier one.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import threading
import time

import redis

from chattts_farm import redis_keys
from worker.batches import take_all

logger = logging.getLogger(__name__)

# How long a restorer holds a dead instance's messages to itself; restoring takes milliseconds.
RESTORE_LOCK_S = 60


def instance_name() -> str:
    """This process's instance: its pid and start time, told apart from a restarted namesake."""
    return f"{os.getpid()}.{int(time.time())}"


class HeldMessages:
    """The delivery tags of the messages this worker process holds, by job id, kept in Redis as they
    come and go (Celery tells a job's id as it returns, its message's tag only as it arrives).

    The changes are written by a thread of their own, all that came meanwhile in one round trip and in
    the order they came: Celery's message loop, which notes each message it receives, and the job
    threads, which note their return, never wait for Redis here. A message's tag reaches Redis a round
    trip after its message at most: a process killed before that leaves that message to the visibility
    timeout, as before there were held messages.
    """

    def __init__(self, client: redis.Redis, worker_name: str, instance: str, ttl_s: int):
        self.client = client
        self.key = redis_keys.held_messages(worker_name, instance)
        self.ttl_s = ttl_s
        self.tags: dict[str, str] = {}
        self.lock = threading.Lock()
        self._changes: queue.SimpleQueue[tuple[bool, str]] = queue.SimpleQueue()  # (held, tag), in order
        threading.Thread(target=self._write_changes, name="held-messages", daemon=True).start()

    def received(self, job_id: str, delivery_tag: str) -> None:
        with self.lock:
            self.tags[job_id] = delivery_tag
        self._changes.put((True, delivery_tag))

    def returned(self, job_id: str) -> None:
        with self.lock:
            delivery_tag = self.tags.pop(job_id, None)
        if delivery_tag is not None:
            self._changes.put((False, delivery_tag))

    def _write_changes(self) -> None:
        while True:
            self._write(functools.partial(self._noted, changes=take_all(self._changes)))

    def _noted(self, pipeline: redis.client.Pipeline, changes: list[tuple[bool, str]]) -> redis.client.Pipeline:
        for held, tag in changes:
            (pipeline.sadd if held else pipeline.srem)(self.key, tag)
        if any(held for held, _ in changes):
            pipeline.expire(self.key, self.ttl_s)
        return pipeline

    def keep_alive(self) -> None:
        """Renew the set's expiry (at each heartbeat): it outlives a dead process by the visibility
        timeout at most, when the messages come back anyway."""
        self._write(lambda pipeline: pipeline.expire(self.key, self.ttl_s))

    def _write(self, commands) -> None:
        # Failing, the job runs on: were this process to die, its messages would come back after the
        # visibility timeout, as they did before.
        try:
            commands(self.client.pipeline(transaction=False)).execute()
        except redis.RedisError as error:
            logger.warning("could not note the messages this worker holds: %s", error)


def restore_lapsed(client: redis.Redis, celery_app, own_instance: str) -> int:
    """Put the messages of every worker instance whose heartbeat has lapsed back on their queues;
    returns how many messages were restored (acknowledged ones are not)."""
    restored = 0
    for key in client.scan_iter(match=redis_keys.HELD_MESSAGES_PREFIX + "*", count=100):
        worker_name, instance = redis_keys.held_messages_owner(key.decode())
        if instance == own_instance or _alive(client, worker_name, instance):
            continue
        if not client.set(redis_keys.restore_lock(worker_name, instance), own_instance, nx=True, ex=RESTORE_LOCK_S):
            continue  # another live worker restores them
        tags = [tag.decode() for tag in client.smembers(key)]
        still_held = _restore(celery_app, tags)
        client.delete(key)
        restored += still_held
        logger.warning(
            "worker %s (instance %s) stopped beating: %d of its %d messages put back on their queues",
            worker_name,
            instance,
            still_held,
            len(tags),
        )
    return restored


def _alive(client: redis.Redis, worker_name: str, instance: str) -> bool:
    beat = client.get(redis_keys.heartbeat(worker_name))
    return beat is not None and json.loads(beat).get("instance") == instance


def _restore(celery_app, tags: list[str]) -> int:
    """Restore each tag's message through kombu (a transaction per tag: the message moves from the
    unacknowledged hash to the head of its queue, or nothing happens); how many were still held."""
    with celery_app.connection_for_write() as connection:
        channel = connection.default_channel
        held = [tag for tag in tags if channel.client.hexists(channel.unacked_key, tag)]
        for tag in held:
            channel.qos.restore_by_tag(tag)
    return len(held)
