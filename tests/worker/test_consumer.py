"""The workers' Celery consumer sends its task events in batches (worker.consumer): real workers, real Redis."""

import base64
import json
import threading
import time

import redis

from chattts_farm.contract import TASK_NAME
from worker.consumer import EVENTS_EVERY_S

# Celery buffers this many task events at most before it sends them, whatever the consumer says.
CELERY_BUFFER_LIMIT = 24


def test_a_bursts_task_events_all_reach_listeners_in_a_few_batched_messages(workers):
    listener = redis.Redis.from_url(workers.redis_url).pubsub()
    listener.psubscribe("*celeryev/task.multi")
    received: list[tuple[float, list[dict]]] = []  # each message's arrival, and its events
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            message = listener.get_message(timeout=0.05)
            if message and message["type"] == "pmessage":
                body = json.loads(base64.b64decode(json.loads(message["data"])["body"]))
                received.append((time.monotonic(), body))

    reader = threading.Thread(target=listen, daemon=True)
    reader.start()
    try:
        client = workers.client
        sent = [client.send_task(TASK_NAME, kwargs={"text": f"Burst job {i}.", "seed": i}) for i in range(30)]
        assert all(job.get(timeout=120)["duration_s"] > 0 for job in sent)
        ids = {job.id for job in sent}

        def events_of(kind: str) -> set[str]:
            return {event["uuid"] for _, events in received for event in events if event["type"] == kind} & ids

        # Flower and the ops page hear of every job's start and end, a little later than they happened.
        deadline = time.monotonic() + 10 * EVENTS_EVERY_S + 5
        while events_of("task-succeeded") != ids and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        reader.join(timeout=5)
        listener.close()
    assert events_of("task-received") == events_of("task-started") == events_of("task-succeeded") == ids

    # Each worker's messages come EVENTS_EVERY_S apart at least, unless Celery's buffer filled first.
    by_host: dict[str, list[tuple[float, int]]] = {}
    for arrived, events in received:
        by_host.setdefault(events[0]["hostname"], []).append((arrived, len(events)))
    events_sent = sum(len(events) for _, events in received)
    assert len(received) * 3 <= events_sent, f"{len(received)} messages for {events_sent} events"
    for host, messages in by_host.items():
        for (before, _), (arrived, count) in zip(messages, messages[1:], strict=False):
            # Arrivals may bunch up behind a slow reader: the gaps are checked with some room.
            assert count >= CELERY_BUFFER_LIMIT or arrived - before >= EVENTS_EVERY_S / 2, (host, messages)
