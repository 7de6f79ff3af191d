"""Garbage on a worker's queue: a real worker process takes every kind of broken message off its
queue, keeps it in the dead-letter list, and goes on serving, without a restart."""

import base64
import copy
import functools
import json

import pytest
import redis

from chattts_farm import redis_keys
from chattts_farm.contract import DEFAULT_QUEUE, TASK_NAME
from cli.local_services import free_port, start_redis_server
from tests.support import Workers, wait_until

# Each broken message carries its name, so its dead letter can be told apart.
RAW_GARBAGE = {
    "not JSON": b"garbage: not JSON {",
    "not UTF-8": b"\xff\xfe garbage: not UTF-8",
    "a JSON list": b'["garbage: a JSON list"]',
}
# Changes to a real task message's envelope, by dotted path (DELETED removes the part), and what each breaks.
DELETED = object()
BROKEN_ENVELOPES = {
    "a body that is not base64": {"body": "!!garbage: a body that is not base64!!"},
    "headers that are not an object": {"headers": "garbage: headers that are not an object"},
    "no delivery tag": {"properties.delivery_tag": DELETED},
    "an undecodable body": {"body": b"\xff garbage: an undecodable body"},
    "a pickled body": {"content-type": "application/x-python-serialize", "body": b"\x80\x04K\x01."},
    "an unknown task": {"headers.task": "garbage.no-such-task"},
    "a body of the wrong shape": {"body": b'"garbage: a body of the wrong shape"'},
    "not a task message": {"headers.task": DELETED, "body": b"[]"},
    "a time limit that is no time limit": {"headers.timelimit": "garbage"},
}


@pytest.fixture
def own_worker(data_dir, tmp_path):
    """One CPU worker on a Redis of its own: garbage must not reach the session's shared workers."""
    port = free_port()
    server = start_redis_server(port, tmp_path / "redis", "--save", "", "--appendonly", "no")
    try:
        workers = Workers.start(f"redis://127.0.0.1:{port}/0", data_dir, tmp_path / "workers.log", count=1)
        yield workers
        workers.stop()
    finally:
        server.terminate()
        server.wait(timeout=20)


def real_envelope(workers: Workers) -> dict:
    """The message a plain Celery client sends for a job, as it lies in Redis (sent where no worker
    takes it, then addressed as if sent to the farm's queue)."""
    workers.client.send_task(TASK_NAME, kwargs={"text": "Never spoken."}, queue="nobody")
    envelope = json.loads(redis.Redis.from_url(workers.redis_url).rpop("nobody"))
    envelope["properties"]["delivery_info"]["routing_key"] = DEFAULT_QUEUE
    return envelope


def broken(envelope: dict, name: str, changes: dict) -> bytes:
    message = copy.deepcopy(envelope)
    message["headers"]["id"] = f"garbage: {name}"
    for path, value in changes.items():
        *parents, last = path.split(".")
        part = functools.reduce(lambda inner, key: inner[key], parents, message)
        if value is DELETED:
            del part[last]
        else:
            part[last] = base64.b64encode(value).decode() if isinstance(value, bytes) else value
    return json.dumps(message).encode()


def dead_letters(store: redis.Redis) -> list[dict]:
    return [json.loads(entry) for entry in store.lrange(redis_keys.DEAD_LETTERS, 0, -1)]


def test_broken_messages_are_dead_lettered_and_the_worker_keeps_serving_without_a_restart(own_worker):
    client = own_worker.client
    store = redis.Redis.from_url(own_worker.redis_url)
    before = client.send_task("chattts.health", queue="cpu0").get(timeout=30)
    envelope = real_envelope(own_worker)
    garbage = {
        **RAW_GARBAGE,
        **{name: broken(envelope, name, changes) for name, changes in BROKEN_ENVELOPES.items()},
    }
    for message in garbage.values():
        store.lpush(DEFAULT_QUEUE, message)

    job = client.send_task(TASK_NAME, kwargs={"text": "Still serving after the garbage."})
    assert job.get(timeout=60)["duration_s"] > 0
    wait_until(lambda: len(dead_letters(store)) >= len(garbage), 30, "every broken message to be dead-lettered")

    letters = dead_letters(store)
    for name in garbage:
        kept = [letter for letter in letters if f"garbage: {name}" in letter["message"]]
        assert len(kept) == 1, (name, letters)
        assert kept[0]["queue"] == DEFAULT_QUEUE and kept[0]["reason"]
    assert client.send_task("chattts.health", queue="cpu0").get(timeout=30)["pid"] == before["pid"]
    assert store.llen(DEFAULT_QUEUE) == 0
    # Nothing is left delivered and unacknowledged (the last answers are acknowledged just after).
    wait_until(lambda: store.hlen(redis_keys.UNACKED_HASH) == 0, 10, "no message to be left unacknowledged")
    log = own_worker.log()
    assert "Unrecoverable error" not in log and "exited with" not in log
    assert log.count(f"moved to {redis_keys.DEAD_LETTERS}") == len(garbage)


def test_the_dead_letter_list_keeps_only_the_newest(own_worker):
    store = redis.Redis.from_url(own_worker.redis_url)
    for number in range(redis_keys.DEAD_LETTERS_KEPT + 5):
        store.lpush(DEFAULT_QUEUE, f"garbage number {number}")
    wait_until(
        lambda: f"garbage number {redis_keys.DEAD_LETTERS_KEPT + 4}" in dead_letters(store)[0]["message"],
        60,
        "the last message to be dead-lettered",
    )
    assert store.llen(redis_keys.DEAD_LETTERS) == redis_keys.DEAD_LETTERS_KEPT
