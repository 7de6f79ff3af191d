"""The one place the farm's Celery app is built.

``create_celery(settings)`` is torch-free: the web app builds its client with it. Workers run
``celery -A worker.celery_app worker`` (``chattts-farm worker`` does that per GPU), which uses the
module-level ``app`` below and imports the task bodies of :mod:`worker.tasks`.
"""

from __future__ import annotations

from celery import Celery

from worker.contract import DEFAULT_QUEUE
from worker.settings import Settings


def create_celery(settings: Settings) -> Celery:
    transport_options = {
        # A delivered job that is not acknowledged within this time goes back to the queue: this is
        # how the jobs of a SIGKILLed worker reach a live one. See Settings.visibility_timeout_s for
        # why it is longer than any job can be held.
        "visibility_timeout": settings.visibility_timeout_s,
        # Sweep for such jobs every interval (kombu's default is ~100 s between real sweeps).
        "unacked_restore_interval": settings.unacked_restore_interval_s,
        "unacked_restore_throttle": 1,
    }
    app = Celery("chattts_farm", broker=settings.redis_url, backend=settings.redis_url,
                 include=["worker.tasks"])
    app.conf.update(
        task_default_queue=DEFAULT_QUEUE,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # Acknowledge a job only when it has finished: a worker that dies holding jobs leaves them
        # unacknowledged, and Redis hands them out again.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # Each worker thread holds one job; a worker process holds as many as it batches at once.
        worker_prefetch_multiplier=1,
        task_track_started=True,
        result_extended=True,
        result_expires=settings.result_ttl_s,
        # Events let Flower (and the ops page) see tasks and workers.
        worker_send_task_events=True,
        task_send_sent_event=True,
        broker_transport_options=transport_options,
        result_backend_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        # A worker rides out a Redis restart: a job's progress report or result that cannot be stored
        # is retried until Redis is back (checking again at least every second), not failed. Failing
        # it would kill the job's thread while its batch runs on, leaving its message unacknowledged
        # until the visibility timeout (half an hour) hands it out again. (The web gives up quickly.)
        result_backend_always_retry=True,
        result_backend_max_sleep_between_retries_ms=1000,
        # Every job thread of a worker reports progress and stores its result through the backend.
        redis_max_connections=2 * settings.batch_jobs + 32,
        worker_hijack_root_logger=False,
    )
    app.farm_settings = settings
    return app


app = create_celery(Settings.from_env())
