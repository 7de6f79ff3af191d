"""Back-pressure: past the cap on jobs waiting (the farm's, or a key's) a submission is refused with
Retry-After and leaves nothing behind; the counts follow the jobs as they start, end or are cancelled,
and hold across web processes."""

import dataclasses
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import flask_migrate

from chattts_farm import backlog, redis_keys
from chattts_farm.contract import DEFAULT_QUEUE, InvalidRequest
from tests.web.access.support import bearer, make_key
from web import admission, create_app
from web.access import api_keys

SUBMITTERS = 16


def capped_app(tiny_settings, tmp_path, redis_url, **caps):
    settings = dataclasses.replace(
        tiny_settings, redis_url=redis_url, data_dir=tmp_path, rate_limit_per_minute=1000, **caps
    )
    app = create_app({"TESTING": True, "SETTINGS": settings})
    with app.app_context():
        flask_migrate.upgrade()
    return app


def waiting(app) -> int:
    return backlog.count_waiting(app.extensions["backends"].redis)


def queued_messages(app, queue: str = DEFAULT_QUEUE) -> list[str]:
    """The task ids of the messages waiting in a jobs' queue list (by default the normal jobs')."""
    client = app.extensions["backends"].redis
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]


def reserved_jobs(app, key) -> set[str]:
    """The jobs holding a reservation of the key's audio quota today."""
    day = f"{datetime.now(UTC):%Y%m%d}"
    client = app.extensions["backends"].redis
    return {
        job_id.decode() for job_id in client.hkeys(redis_keys.audio_quota_reservations(api_keys.hash_key(key), day))
    }


def submit(client, key=None, text="Back pressure."):
    return client.post("/api/jobs", json={"text": text}, headers=bearer(key) if key else {})


def assert_try_again_later(answer, status):
    assert answer.status_code == status
    assert int(answer.headers["Retry-After"]) > 0
    assert "waiting to start" in answer.get_json()["error"]


def test_past_the_farms_cap_a_job_is_a_503_with_retry_after_and_nothing_of_it_is_left(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True, max_queued_jobs=3)
    client, ann = app.test_client(), make_key(app, "ann")
    # Three keys, a job each: none holds more than its fair share, the farm's cap is what refuses.
    ann_job = submit(client, ann).get_json()["id"]
    accepted = [ann_job, *(submit(client, make_key(app, name)).get_json()["id"] for name in ("bob", "cy"))]

    refused = submit(client, ann)

    assert_try_again_later(refused, 503)
    assert [job["id"] for job in client.get("/api/jobs", headers=bearer(ann)).get_json()["jobs"]] == [ann_job]
    assert sorted(queued_messages(app)) == sorted(accepted)
    assert reserved_jobs(app, ann) == {ann_job}
    assert app.extensions["backends"].redis.zcard(redis_keys.ADMISSIONS) == 0
    assert waiting(app) == 3


def test_a_key_holds_at_most_its_fair_share_of_a_contended_farm_and_another_key_still_finds_room(
    tiny_settings, tmp_path, idle_redis_url
):
    # The keys' own cap (1000) is far above the farm's: only the fair share stops them.
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True, max_queued_jobs=6)
    client, ann, bob = app.test_client(), make_key(app, "ann"), make_key(app, "bob")

    # Alone, ann may hold half the farm's cap (6 // (1 key + 1)), whatever her own cap: the rest waits
    # for whoever comes next.
    assert [submit(client, ann).status_code for _ in range(4)] == [202, 202, 202, 429]
    # Bob has 6 // (2 keys + 1); ann, over hers now, is refused until some of hers have started.
    assert [submit(client, bob).status_code for _ in range(3)] == [202, 202, 429]
    over_share = submit(client, ann)

    assert_try_again_later(over_share, 429)
    assert "fair share" in over_share.get_json()["error"] and "2 keys" in over_share.get_json()["error"]
    assert over_share.get_json()["field"] == "Authorization"
    assert waiting(app) == len(queued_messages(app)) == 5
    assert submit(client, make_key(app, "cy")).status_code == 202


def test_a_key_no_longer_counts_among_the_keys_waiting_once_its_jobs_have_started(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True, max_queued_jobs=12)
    client, ann, bob, cy = (app.test_client(), *(make_key(app, name) for name in ("ann", "bob", "cy")))
    for _ in range(3):
        assert submit(client, cy).status_code == 202 and submit(client, ann).status_code == 202
    bobs = [submit(client, bob).get_json()["id"] for _ in range(2)]
    assert submit(client, ann).status_code == 429  # 12 // (3 keys + 1) = 3

    # Bob's jobs start on a worker: written as a worker writes a start, taken off the queue as it takes them.
    redis = app.extensions["backends"].redis
    for raw in redis.lrange(DEFAULT_QUEUE, 0, -1):
        if json.loads(raw)["headers"]["id"] in bobs:
            redis.lrem(DEFAULT_QUEUE, 1, raw)
    for job_id in bobs:
        app.extensions["backends"].celery.backend.store_result(job_id, None, "STARTED")

    assert waiting(app) == 6  # still contended: half the cap
    assert submit(client, ann).status_code == 202  # 12 // (2 keys + 1) = 4


def test_a_cancelled_jobs_message_leaves_the_queue_at_once_and_its_place_in_the_farms_cap_with_it(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, max_queued_jobs=2)
    client = app.test_client()
    first, second = (submit(client).get_json() for _ in range(2))
    assert submit(client).status_code == 503

    assert client.delete(first["status_url"]).get_json()["status"] == "cancelled"

    # No worker can take it: a worker takes jobs only from the queue lists.
    assert queued_messages(app) == [second["id"]] and waiting(app) == 1
    assert submit(client).status_code == 202


def test_past_its_own_cap_a_key_gets_a_429_and_other_keys_are_still_served(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True, max_queued_jobs_per_key=2)
    client, greedy, other = app.test_client(), make_key(app, "greedy"), make_key(app, "other")
    accepted = [submit(client, greedy).get_json()["id"] for _ in range(2)]

    refused = submit(client, greedy)

    assert_try_again_later(refused, 429)
    assert refused.get_json()["field"] == "Authorization"
    assert reserved_jobs(app, greedy) == set(accepted)
    assert sorted(queued_messages(app)) == sorted(accepted)
    assert len(client.get("/api/jobs", headers=bearer(greedy)).get_json()["jobs"]) == 2
    assert submit(client, other).status_code == 202


def test_a_job_refused_by_the_audio_quota_gives_its_place_in_the_queue_back(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(
        tiny_settings, tmp_path, idle_redis_url, require_api_key=True, daily_audio_quota_s=1, max_queued_jobs=1
    )
    client, key = app.test_client(), make_key(app, "bo")

    refused = submit(client, key, text="A text far longer than the single second of audio this key may have today.")

    assert refused.status_code == 429 and "quota" in refused.get_json()["error"]
    assert waiting(app) == 0
    assert app.extensions["backends"].redis.zcard(redis_keys.queued_jobs(api_keys.hash_key(key))) == 0
    assert submit(client, key, text="Hi.").status_code == 202


def test_a_keys_cancelled_or_failed_jobs_free_their_places_even_unseen_by_the_web(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True, max_queued_jobs_per_key=2)
    client, key = app.test_client(), make_key(app, "cy")
    first, second = (submit(client, key).get_json() for _ in range(2))
    assert submit(client, key).status_code == 429

    assert client.delete(first["status_url"], headers=bearer(key)).get_json()["status"] == "cancelled"
    assert submit(client, key).status_code == 202
    assert submit(client, key).status_code == 429
    # The second job fails on its worker (written as a worker writes a failure); no request has seen it yet.
    app.extensions["backends"].celery.backend.store_result(second["id"], InvalidRequest("text", "no"), "FAILURE")
    assert submit(client, key).status_code == 202


def test_jobs_that_workers_started_and_finished_free_their_places_without_the_web_looking(
    tiny_settings, tmp_path, redis_url, workers
):
    app = capped_app(tiny_settings, tmp_path, redis_url, require_api_key=True, max_queued_jobs_per_key=2)
    client, key = app.test_client(), make_key(app, "dee")
    for _ in range(2):
        sent = [submit(client, key).get_json()["id"] for _ in range(2)]
        for job_id in sent:
            workers.client.AsyncResult(job_id).get(timeout=120)
        assert waiting(app) == 0
    assert len(client.get("/api/jobs", headers=bearer(key)).get_json()["jobs"]) == 4


def test_two_web_processes_at_the_edge_of_the_cap_admit_exactly_as_many_jobs_as_it_allows(
    tiny_settings, tmp_path, idle_redis_url
):
    cap = 5
    apps = [capped_app(tiny_settings, tmp_path, idle_redis_url, max_queued_jobs=cap) for _ in range(2)]
    everyone_ready = threading.Barrier(SUBMITTERS)

    def submit_at_once(number):
        client = apps[number % 2].test_client()
        everyone_ready.wait()
        return submit(client).status_code

    with ThreadPoolExecutor(SUBMITTERS) as pool:
        statuses = list(pool.map(submit_at_once, range(SUBMITTERS)))

    assert sorted(statuses) == [202] * cap + [503] * (SUBMITTERS - cap)
    assert len(queued_messages(apps[0])) == waiting(apps[0]) == cap


def test_an_admission_whose_job_was_never_sent_lapses_by_itself(tiny_settings, tmp_path, idle_redis_url, monkeypatch):
    monkeypatch.setattr(admission, "ADMISSION_S", 1)
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, max_queued_jobs=1)
    with app.test_request_context():
        admission.admit(None, "a-job-whose-web-process-died-before-sending-it")
    assert waiting(app) == 1
    assert submit(app.test_client()).status_code == 503

    time.sleep(2)

    assert waiting(app) == 0
    assert submit(app.test_client()).status_code == 202


def test_readyz_reports_the_queue_and_is_503_while_the_farm_takes_no_more_jobs(
    tiny_settings, tmp_path, redis_url, workers
):
    app = capped_app(tiny_settings, tmp_path, redis_url, max_queued_jobs=1)
    client = app.test_client()
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json()["queue"] == {"waiting": 0, "max_queued_jobs": 1, "accepting": True}

    with app.test_request_context():  # a job admitted and not yet sent fills the queue as a waiting one does
        admission.admit(None, "a-job-on-its-way-to-the-queue")
    full = client.get("/readyz")

    assert full.status_code == 503
    assert full.get_json()["ready"] is False and full.get_json()["workers"] >= 1
    assert full.get_json()["queue"] == {"waiting": 1, "max_queued_jobs": 1, "accepting": False}
    metrics = client.get("/metrics").get_data(as_text=True)
    assert "chattts_jobs_waiting 1.0" in metrics and "chattts_max_queued_jobs 1.0" in metrics

    with app.test_request_context():
        admission.release(None, "a-job-on-its-way-to-the-queue")
    assert client.get("/readyz").status_code == 200


def test_the_openai_endpoint_is_capped_as_jobs_are_and_gives_back_its_wait_slot(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, max_queued_jobs=1)
    client = app.test_client()
    assert submit(client).status_code == 202

    refused = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Too many.", "voice": "alloy"})

    assert_try_again_later(refused, 503)
    assert len(client.get("/api/jobs").get_json()["jobs"]) == 1
    assert app.extensions["backends"].redis.zcard(redis_keys.wait_slots("anonymous")) == 0


def test_the_openai_endpoint_answers_429_past_a_keys_cap(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True, max_queued_jobs_per_key=1)
    client, key = app.test_client(), make_key(app, "eve")
    assert submit(client, key).status_code == 202

    refused = client.post("/v1/audio/speech", json={"input": "Too many.", "voice": "alloy"}, headers=bearer(key))

    assert_try_again_later(refused, 429)
