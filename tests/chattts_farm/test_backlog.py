"""The contract's backlog helper: a Celery caller reads how many jobs wait, and whether the farm takes
more, before it sends."""

import json
import uuid

import redis
from celery import Celery

from chattts_farm.backlog import read_backlog, withdraw
from chattts_farm.contract import CELERY_DEFAULT_QUEUE, DEFAULT_QUEUE, TASK_NAME


def waiting_task_ids(client) -> list[str]:
    return [
        json.loads(raw)["headers"]["id"]
        for queue in (DEFAULT_QUEUE, CELERY_DEFAULT_QUEUE)
        for raw in client.lrange(queue, 0, -1)
    ]


def test_jobs_sent_to_either_queue_count_as_waiting_until_the_cap_says_the_farm_is_full(idle_redis_url):
    caller = Celery(broker=idle_redis_url, backend=idle_redis_url)
    assert read_backlog(redis_url=idle_redis_url, max_queued_jobs=2).waiting == 0

    caller.send_task(TASK_NAME, kwargs={"text": "Routed."}, queue=DEFAULT_QUEUE)
    half = read_backlog(redis_url=idle_redis_url, max_queued_jobs=2)
    caller.send_task(TASK_NAME, kwargs={"text": "A plain send_task goes to Celery's default queue."})
    full = read_backlog(redis_url=idle_redis_url, max_queued_jobs=2)

    assert (half.waiting, half.accepting) == (1, True)
    assert (full.waiting, full.accepting) == (2, False)


def test_the_cap_is_the_farms_setting_unless_given(idle_redis_url, monkeypatch):
    monkeypatch.setenv("CHATTTS_FARM_MAX_QUEUED_JOBS", "7")
    monkeypatch.setenv("CHATTTS_FARM_REDIS_URL", idle_redis_url)

    backlog = read_backlog()

    assert (backlog.waiting, backlog.max_queued_jobs, backlog.accepting) == (0, 7, True)


def test_withdrawing_a_task_takes_out_its_own_message_and_none_that_merely_names_its_id(idle_redis_url):
    caller, client = Celery(broker=idle_redis_url, backend=idle_redis_url), redis.Redis.from_url(idle_redis_url)
    cancelled = str(uuid.uuid4())
    # Scanned before it, messages that hold its id elsewhere: in a text, as a parent and root task.
    caller.send_task(TASK_NAME, kwargs={"text": f"Job {cancelled} was mine."}, queue=DEFAULT_QUEUE)
    caller.send_task(TASK_NAME, kwargs={"text": "The cancelled one."}, task_id=cancelled)
    caller.send_task(TASK_NAME, kwargs={"text": "Its child."}, parent_id=cancelled, root_id=cancelled)
    others = [task_id for task_id in waiting_task_ids(client) if task_id != cancelled]

    assert withdraw(client, cancelled) == 1

    assert sorted(waiting_task_ids(client)) == sorted(others)
    assert read_backlog(client=client, max_queued_jobs=3).waiting == 2
    assert withdraw(client, cancelled) == 0  # taken already (by a worker, say): nothing else goes


def test_a_message_deep_in_a_long_queue_is_found(idle_redis_url):
    caller, client = Celery(broker=idle_redis_url, backend=idle_redis_url), redis.Redis.from_url(idle_redis_url)
    oldest = caller.send_task(TASK_NAME, kwargs={"text": "First in."}, queue=DEFAULT_QUEUE).id
    caller.send_task(TASK_NAME, kwargs={"text": "Later."}, queue=DEFAULT_QUEUE)
    client.lpush(DEFAULT_QUEUE, *[client.lindex(DEFAULT_QUEUE, 0)] * 1200)  # read by the script in chunks of 500

    assert withdraw(client, oldest) == 1
    assert oldest not in waiting_task_ids(client) and client.llen(DEFAULT_QUEUE) == 1201


def test_a_batchs_thousands_of_messages_are_withdrawn_in_one_call_and_the_others_keep_their_order(idle_redis_url):
    caller, client = Celery(broker=idle_redis_url, backend=idle_redis_url), redis.Redis.from_url(idle_redis_url)
    with caller.producer_or_acquire() as producer, producer.batch(max_size=3000):
        sent = [
            caller.send_task(TASK_NAME, kwargs={"text": f"Item {number}."}, queue=DEFAULT_QUEUE, producer=producer).id
            for number in range(3000)
        ]
    cancelled, kept = sent[::2], sent[1::2]

    assert withdraw(client, *cancelled, str(uuid.uuid4())) == 1500

    assert waiting_task_ids(client) == kept[::-1]  # kombu pushes at the head: the newest first
