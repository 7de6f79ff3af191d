"""The workers' Celery app: what its job threads share."""

import threading

from worker.celery_app import app


def test_every_job_thread_stores_results_through_one_backend_and_its_one_connection_pool():
    # Celery's default is a backend, and a pool of Redis connections, for each thread: 2,048 of them on a GPU.
    first = app.backend
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(app.backend)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 4 and all(backend is first for backend in seen)
