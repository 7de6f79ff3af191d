"""The farm's Celery configuration, for every process that talks to the queue: workers, web processes
and outside services. Torch-free.

``create_celery(settings)`` gives a client configured as the contract needs (JSON, late acknowledgement,
the visibility timeout, result expiry, events). Workers build their app from it in
:mod:`worker.celery_app` and add what only a worker needs; the web adds its own impatience.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from chattts_farm.contract import DEFAULT_PRIORITY, DEFAULT_QUEUE, PRIORITY_QUEUES, TASK_NAME
from chattts_farm.settings import Settings


def create_celery(settings: Settings, *, include: tuple[str, ...] = ()) -> Celery:
    transport_options = {
        # A delivered job that is not acknowledged within this time goes back to the queue: this is
        # how the jobs of a SIGKILLed worker reach a live one. See Settings.visibility_timeout_s for
        # why it is longer than any job can be held.
        "visibility_timeout": settings.visibility_timeout_s,
        # Sweep for such jobs every interval (kombu's default is ~100 s between real sweeps).
        "unacked_restore_interval": settings.unacked_restore_interval_s,
        "unacked_restore_throttle": 1,
        # A worker reads its queues in the order it is given them (worker.supervisor), not round-robin:
        # interactive jobs before normal ones before bulk ones. One queue per priority rather than
        # Redis's priority steps: a message that names no priority lands on the steps' first list, so
        # any plain Celery client's job would pass ahead of the bulk and the normal ones; a plain
        # client's job lands on the normal queue here, and the queues' names say what waits on them.
        "queue_order_strategy": "priority",
    }
    app = Celery("chattts_farm", broker=settings.redis_url, backend=settings.redis_url, include=list(include))
    app.conf.update(
        task_default_queue=DEFAULT_QUEUE,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # Acknowledge a job only when it has finished: a worker that dies holding jobs leaves them
        # unacknowledged, and Redis hands them out again.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_track_started=True,
        result_extended=True,
        result_expires=settings.result_ttl_s,
        # Events let Flower (and the ops page) see tasks and workers.
        worker_send_task_events=True,
        task_send_sent_event=True,
        broker_transport_options=transport_options,
        result_backend_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        task_routes=(route_by_priority,),
    )
    return app


def route_by_priority(name: str, args: Any, kwargs: dict | None, options: dict, **_: Any) -> dict | None:
    """A synthesis job goes to its priority's queue (an unknown priority to the normal queue, where the
    task refuses it); a queue given to ``send_task`` wins over this."""
    if name != TASK_NAME:
        return None
    priority = (kwargs or {}).get("priority", DEFAULT_PRIORITY)
    return {"queue": PRIORITY_QUEUES.get(priority.lower() if isinstance(priority, str) else priority, DEFAULT_QUEUE)}
