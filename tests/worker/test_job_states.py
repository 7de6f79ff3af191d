"""A running job's states in Celery's result backend (real Redis): never written over the job's end."""

import json

import pytest
from celery.app.task import Context

from chattts_farm.celery_client import create_celery
from chattts_farm.contract import PROGRESS_STATE, TASK_NAME
from chattts_farm.settings import Settings
from worker.job_states import JobStates


@pytest.fixture
def backend(redis_url):
    return create_celery(Settings.from_env(redis_url=redis_url)).backend


def a_request(job_id: str) -> Context:
    return Context(id=job_id, task=TASK_NAME, args=[], kwargs={"text": "Hi."}, hostname="cpu0@test", retries=0)


def stored(backend, job_id: str) -> dict:
    return json.loads(backend.client.get(backend.get_key_for_task(job_id)))


def test_a_job_starts_as_celery_would_store_its_start_and_its_watchers_hear_of_it(backend):
    subscriber = backend.client.pubsub()
    subscriber.subscribe(backend.get_key_for_task("start-1"))
    subscriber.get_message(timeout=1)  # the subscription's confirmation
    assert JobStates(backend).start(a_request("start-1"))
    meta = stored(backend, "start-1")
    assert meta["status"] == "STARTED" and meta["task_id"] == "start-1" and meta["name"] == TASK_NAME
    assert meta["result"]["hostname"] == "cpu0@test" and meta["result"]["pid"] > 0
    assert json.loads(subscriber.get_message(timeout=5)["data"]) == meta
    assert backend.client.ttl(backend.get_key_for_task("start-1")) > 0


@pytest.mark.parametrize(("before", "starts"), [("SUCCESS", False), ("FAILURE", True), ("PROGRESS", True)])
def test_a_job_that_succeeded_does_not_start_again_and_keeps_its_result(backend, before, starts):
    job_id = f"again-{before}"
    key = backend.get_key_for_task(job_id)
    backend.client.set(key, json.dumps({"status": before, "result": {"kept": True}}))
    assert JobStates(backend).start(a_request(job_id)) is starts
    assert stored(backend, job_id)["status"] == ("STARTED" if starts else before)


@pytest.mark.parametrize(
    ("before", "overwritten"),
    [("PROGRESS", True), ("STARTED", True), ("SUCCESS", False), ("FAILURE", False), ("REVOKED", False)],
)
def test_a_progress_report_never_overwrites_a_finished_jobs_state(backend, before, overwritten):
    job_id = f"progress-race-{before}"
    backend.client.set(backend.get_key_for_task(job_id), json.dumps({"status": before, "result": {}}))
    pipeline = backend.client.pipeline(transaction=False)
    JobStates(backend).report_progress(pipeline, a_request(job_id), {"progress": 0.5})
    pipeline.execute()
    meta = stored(backend, job_id)
    assert (meta["status"] == PROGRESS_STATE and meta["result"] == {"progress": 0.5}) is overwritten
    assert (backend.client.ttl(backend.get_key_for_task(job_id)) > 0) is overwritten
