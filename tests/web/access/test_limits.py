"""Per-key limits: the daily audio quota (each job reserves its expected audio at submit, and is
settled to its real duration once, when it finishes) and the rate limits, shared by every web process."""

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest
import redis

from chattts_farm import redis_keys
from chattts_farm.contract import InvalidRequest
from chattts_farm.speech_length import expected_seconds
from tests.support import wait_until
from tests.web.access.support import bearer, make_key, well_inside_a_minute
from web import create_app
from web.access import api_keys

pytestmark = pytest.mark.database  # on SQLite and on PostgreSQL

QUOTA_S = 5
# About two seconds of speech by the farm's length rule: two such jobs fit in the quota, a third does not.
TWO_SECONDS = "About two seconds of speech, give or take."
POLLERS = 8


def quota_app(keyed_app, *, with_workers):
    """The keyed app with a daily audio quota of QUOTA_S. Without workers it uses a Redis database no
    worker reads, so its jobs stay queued until the test settles them."""
    settings = keyed_app.config["SETTINGS"]
    redis_url = settings.redis_url if with_workers else settings.redis_url.rsplit("/", 1)[0] + "/15"
    settings = dataclasses.replace(settings, daily_audio_quota_s=QUOTA_S, redis_url=redis_url)
    return create_app({"TESTING": True, "SETTINGS": settings})


def charged_s(app, key, job) -> float:
    """The audio seconds charged to ``key`` for the day ``job`` was submitted on."""
    day = f"{datetime.fromisoformat(job['created_at']):%Y%m%d}"
    client = redis.Redis.from_url(app.config["SETTINGS"].redis_url)
    return float(client.get(redis_keys.audio_quota(api_keys.hash_key(key), day)) or 0)


def wait_until_done(client, key, job):
    def described():
        return client.get(job["status_url"], headers=bearer(key)).get_json()

    wait_until(lambda: described()["status"] == "done", 120, "the job")
    return described()


def test_each_job_reserves_its_expected_audio_at_submit_so_a_burst_cannot_pass_the_quota(keyed_app):
    app = quota_app(keyed_app, with_workers=False)
    client, key = app.test_client(), make_key(app, "carol")
    assert 2 * expected_seconds(TWO_SECONDS, 5) <= QUOTA_S < 3 * expected_seconds(TWO_SECONDS, 5)
    submitted = [client.post("/api/jobs", json={"text": TWO_SECONDS}, headers=bearer(key)) for _ in range(3)]
    assert [answer.status_code for answer in submitted] == [202, 202, 429]
    refused = submitted[-1]
    assert "quota" in refused.get_json()["error"] and int(refused.headers["Retry-After"]) > 0
    # What is left still takes a shorter job; the refused one left no row.
    assert client.post("/api/jobs", json={"text": "Hi."}, headers=bearer(key)).status_code == 202
    assert len(client.get("/api/jobs", headers=bearer(key)).get_json()["jobs"]) == 3


def test_a_cancelled_or_failed_job_gives_back_what_it_reserved(keyed_app):
    app = quota_app(keyed_app, with_workers=False)
    client, key = app.test_client(), make_key(app, "dan")

    def submit():
        return client.post("/api/jobs", json={"text": TWO_SECONDS}, headers=bearer(key))

    first, second = submit().get_json(), submit().get_json()
    assert submit().status_code == 429
    assert client.delete(first["status_url"], headers=bearer(key)).get_json()["status"] == "cancelled"
    assert submit().status_code == 202
    assert submit().status_code == 429
    # The second job fails on its worker (written as a worker writes a failure).
    app.extensions["backends"].celery.backend.store_result(
        second["id"], InvalidRequest("text", "refused by the worker"), "FAILURE"
    )
    assert client.get(second["status_url"], headers=bearer(key)).get_json()["status"] == "failed"
    assert submit().status_code == 202


def test_a_finished_job_is_charged_its_real_duration_and_a_spent_quota_answers_429_until_midnight(keyed_app, workers):
    app = quota_app(keyed_app, with_workers=True)
    client, key = app.test_client(), make_key(app, "erik")
    submitted = [client.post("/api/jobs", json={"text": TWO_SECONDS}, headers=bearer(key)) for _ in range(2)]
    finished = [wait_until_done(client, key, answer.get_json()) for answer in submitted]
    spent = sum(job["result"]["duration_s"] for job in finished)
    assert charged_s(app, key, finished[0]) == pytest.approx(spent)
    assert spent + expected_seconds(TWO_SECONDS, 5) > QUOTA_S
    refused = client.post("/api/jobs", json={"text": TWO_SECONDS}, headers=bearer(key))
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) == pytest.approx(86_400 - time.time() % 86_400, abs=5)


def test_a_job_polled_by_many_requests_as_it_finishes_is_charged_once(keyed_app, workers):
    client, key = keyed_app.test_client(), make_key(keyed_app, "fay")
    job = client.post("/api/jobs", json={"text": TWO_SECONDS}, headers=bearer(key)).get_json()
    workers.client.AsyncResult(job["id"]).get(timeout=120)  # done in Celery; no request has seen it yet
    everyone_ready = threading.Barrier(POLLERS)

    def poll(_):
        everyone_ready.wait()
        return keyed_app.test_client().get(job["status_url"], headers=bearer(key)).get_json()

    with ThreadPoolExecutor(POLLERS) as pool:
        seen = list(pool.map(poll, range(POLLERS)))
    assert {answer["status"] for answer in seen} == {"done"}
    assert charged_s(keyed_app, key, seen[0]) == pytest.approx(seen[0]["result"]["duration_s"])


def test_the_rate_limits_answer_429_with_retry_after_across_app_instances(keyed_app):
    settings = dataclasses.replace(keyed_app.config["SETTINGS"], rate_limit_per_minute=2, read_rate_limit_per_minute=3)
    key = make_key(keyed_app, "dave")
    well_inside_a_minute()
    # Two app instances (as two web processes) share the counts through Redis.
    first = create_app({"TESTING": True, "SETTINGS": settings}).test_client()
    second = create_app({"TESTING": True, "SETTINGS": settings}).test_client()
    reads = [client.get("/api/jobs", headers=bearer(key)).status_code for client in (first, second, first, second)]
    assert reads == [200, 200, 200, 429]
    assert 1 <= int(second.get("/api/jobs", headers=bearer(key)).headers["Retry-After"]) <= 60
    # Changes have their own budget: reads used up do not stop a submission, and the reverse.
    changes = [
        client.post("/api/jobs", json={"text": "Counted."}, headers=bearer(key)).status_code
        for client in (first, second, first)
    ]
    assert changes == [202, 202, 429]
    refused = second.post("/api/jobs", json={"text": "Counted."}, headers=bearer(key))
    assert refused.status_code == 429 and "change" in refused.get_json()["error"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
