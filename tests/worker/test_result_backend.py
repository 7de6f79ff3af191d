"""The workers' result backend (real Redis): Celery's states, each in one round trip, never written over
a job's success."""

import json

import pytest
from celery.app.task import Context

from chattts_farm.celery_client import create_celery
from chattts_farm.contract import PROGRESS_STATE, TASK_NAME
from chattts_farm.settings import Settings
from worker.result_backend import ResultBackend


@pytest.fixture
def backend(redis_url):
    app = create_celery(Settings.from_env(redis_url=redis_url))
    app.conf.result_backend = f"worker.result_backend:ResultBackend+{redis_url}"
    assert isinstance(app.backend, ResultBackend)
    return app.backend


def a_request(job_id: str) -> Context:
    return Context(id=job_id, task=TASK_NAME, args=[], kwargs={"text": "Hi."}, hostname="cpu0@test", retries=0)


def stored(backend, job_id: str) -> dict:
    return json.loads(backend.client.get(backend.get_key_for_task(job_id)))


def a_state(backend, job_id: str, status: str) -> None:
    backend.client.set(backend.get_key_for_task(job_id), json.dumps({"status": status, "result": {"kept": True}}))


def test_a_job_starts_as_celery_would_store_its_start_and_its_watchers_hear_of_it(backend):
    subscriber = backend.client.pubsub()
    subscriber.subscribe(backend.get_key_for_task("start-1"))
    subscriber.get_message(timeout=1)  # the subscription's confirmation
    assert backend.start(a_request("start-1"))
    meta = stored(backend, "start-1")
    assert meta["status"] == "STARTED" and meta["task_id"] == "start-1" and meta["name"] == TASK_NAME
    assert meta["result"]["hostname"] == "cpu0@test" and meta["result"]["pid"] > 0
    assert json.loads(subscriber.get_message(timeout=5)["data"]) == meta
    assert 0 < backend.client.ttl(backend.get_key_for_task("start-1")) <= backend.expires


@pytest.mark.parametrize(("before", "starts"), [("SUCCESS", False), ("FAILURE", True), ("PROGRESS", True)])
def test_a_job_that_succeeded_does_not_start_again_and_keeps_its_result(backend, before, starts):
    job_id = f"again-{before}"
    a_state(backend, job_id, before)
    assert backend.start(a_request(job_id)) is starts
    assert stored(backend, job_id)["status"] == ("STARTED" if starts else before)


def test_a_result_is_stored_and_published_as_celerys_backend_stores_it(backend):
    subscriber = backend.client.pubsub()
    subscriber.subscribe(backend.get_key_for_task("done-1"))
    subscriber.get_message(timeout=1)
    backend.start(a_request("done-1"))
    backend.mark_as_done("done-1", {"duration_s": 1.5}, request=a_request("done-1"))
    meta = stored(backend, "done-1")
    assert meta["status"] == "SUCCESS" and meta["result"] == {"duration_s": 1.5} and meta["task_id"] == "done-1"
    published = [json.loads(subscriber.get_message(timeout=5)["data"])["status"] for _ in range(2)]
    assert published == ["STARTED", "SUCCESS"]
    assert backend.get_task_meta("done-1")["result"] == {"duration_s": 1.5}


@pytest.mark.parametrize("state", ["SUCCESS", "FAILURE", "REVOKED"])
def test_a_job_delivered_again_after_it_succeeded_never_overwrites_its_result(backend, state):
    job_id = f"twice-{state}"
    a_state(backend, job_id, "SUCCESS")
    request = a_request(job_id)
    if state == "SUCCESS":
        backend.mark_as_done(job_id, {"other": True}, request=request)
    elif state == "FAILURE":
        backend.mark_as_failure(job_id, ValueError("late"), request=request)
    else:
        backend.mark_as_revoked(job_id, reason="revoked", request=request)
    assert stored(backend, job_id) == {"status": "SUCCESS", "result": {"kept": True}}


@pytest.mark.parametrize(
    ("before", "overwritten"),
    [("PROGRESS", True), ("STARTED", True), ("SUCCESS", False), ("FAILURE", False), ("REVOKED", False)],
)
def test_a_progress_report_never_overwrites_a_finished_jobs_state(backend, before, overwritten):
    job_id = f"progress-race-{before}"
    a_state(backend, job_id, before)
    pipeline = backend.client.pipeline(transaction=False)
    backend.report_progress(pipeline, a_request(job_id), {"progress": 0.5})
    pipeline.execute()
    meta = stored(backend, job_id)
    assert (meta["status"] == PROGRESS_STATE and meta["result"] == {"progress": 0.5}) is overwritten
    assert (backend.client.ttl(backend.get_key_for_task(job_id)) > 0) is overwritten
