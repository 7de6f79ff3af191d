"""The one place the workers' Celery app is built.

Workers run ``celery -A worker.celery_app worker`` (``chattts-farm worker`` does that per GPU), which
uses the module-level ``app`` below and imports the task bodies of :mod:`worker.tasks`. Importing this
module imports no torch: Flower uses the same app.
"""

from __future__ import annotations

from chattts_farm.celery_client import create_celery
from chattts_farm.settings import Settings

settings = Settings.from_env()
app = create_celery(settings, include=("worker.tasks",))
app.conf.update(
    # Celery's Redis backend, each state stored in one round trip (see worker.result_backend).
    result_backend=f"worker.result_backend:ResultBackend+{settings.redis_url}",
    # Each worker thread holds one job; a worker process holds as many as it has threads.
    worker_prefetch_multiplier=1,
    # A worker rides out a Redis restart: a job's progress report or result that cannot be stored
    # is retried until Redis is back (checking again at least every second), not failed. Failing
    # it would kill the job's thread while its batch runs on, leaving its message unacknowledged
    # until the visibility timeout (half an hour) hands it out again. (The web gives up quickly.)
    result_backend_always_retry=True,
    result_backend_max_sleep_between_retries_ms=1000,
    # Every job thread of a worker stores its result through the backend: one backend and one pool for
    # them all, whose connections are as many as are in use at once, not one for each of the threads
    # (2,048 on a GPU by default: one Redis's 10,000 clients would not serve five GPUs).
    result_backend_thread_safe=True,
    redis_max_connections=2 * settings.max_jobs_in_flight + 32,
    worker_hijack_root_logger=False,
    # A message on a queue that is no job (garbage pushed by hand, a broken client) goes to a
    # dead-letter list and the worker keeps serving, where Celery's own consumer would end it; task
    # events go out in batches (see worker.consumer).
    worker_consumer="worker.consumer:Consumer",
)
