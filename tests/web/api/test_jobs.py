"""The job API, against real Redis and real CPU workers (synthetic-tiny)."""

import dataclasses
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import flask_migrate
import pytest
import redis
import requests
from sqlalchemy import create_engine

from chattts_farm import redis_keys
from chattts_farm.contract import JOB_QUEUES, MAX_SEED
from cli.local_services import free_port
from tests.edge_texts import EDGE_TEXTS
from tests.support import Web, wait_until
from web import create_app
from web.models import Job, JobStatus, db
from worker.audio import decode

pytestmark = pytest.mark.database  # on SQLite and on PostgreSQL

# More than a web process's database connections (SQLAlchemy's pool: 5, and 10 more at a pinch).
POOL_OVERFLOWING_REQUESTS = 24

OTHER_JOB = str(uuid.uuid4())
LONG_TEXT = " ".join(f"Sentence {word} of a long job." for word in "abcdefghijklmnopqrstuvwxyz" * 2)


def wait_for(client, job_id, statuses, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/api/jobs/{job_id}").get_json()
        if body["status"] in statuses:
            return body
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} stayed {body['status']}")


def test_a_job_is_accepted_recorded_and_done_with_downloadable_audio(client, app, workers):
    answer = client.post(
        "/api/jobs", json={"text": "Hello from the web.", "voice": MAX_SEED, "format": "flac", "speed": 4, "seed": 7}
    )
    assert answer.status_code == 202
    body = answer.get_json()
    assert body["status"] == "queued" and body["status_url"] == f"/api/jobs/{body['id']}"
    assert answer.headers["Location"] == body["status_url"]
    with app.app_context():
        assert db.session.get(Job, body["id"]) is not None

    done = wait_for(client, body["id"], {"done"})
    assert done["progress"] == 1.0 and done["voice"]["seed"] == MAX_SEED
    for moment in (done["created_at"], done["finished_at"]):
        assert datetime.fromisoformat(moment).utcoffset() == timedelta(0)
    assert done["result"]["format"] == "flac" and done["result"]["seed"] == 7
    audio = client.get(done["result"]["audio_url"])
    assert audio.status_code == 200 and audio.mimetype == "audio/flac"
    assert f'filename="chattts-{body["id"]}.flac"' in audio.headers["Content-Disposition"]
    samples, rate = decode(audio.data)
    assert abs(len(samples) / rate - done["result"]["duration_s"]) < 0.05


def test_audio_is_409_until_done_404_when_unknown_410_once_expired(client, workers, audio_store):
    job_id = client.post("/api/jobs", json={"text": LONG_TEXT}).get_json()["id"]
    early = client.get(f"/api/jobs/{job_id}/audio")
    assert early.status_code == 409 and "error" in early.get_json()
    assert client.get("/api/jobs/no-such-job/audio").status_code == 404
    assert client.get("/api/jobs/no-such-job").status_code == 404
    assert client.get("/api/jobs/%00").status_code == 404  # PostgreSQL refuses NUL in text: no 500
    wait_for(client, job_id, {"done"})
    assert audio_store.delete(audio_store.key(job_id, "wav"))
    assert client.get(f"/api/jobs/{job_id}/audio").status_code == 410


def test_a_running_job_can_be_cancelled(client, workers):
    job_id = client.post("/api/jobs", json={"text": LONG_TEXT}).get_json()["id"]
    wait_for(client, job_id, {"running"})
    cancelled = client.delete(f"/api/jobs/{job_id}")
    assert cancelled.status_code == 200 and cancelled.get_json()["status"] == "cancelled"
    time.sleep(2)
    assert client.get(f"/api/jobs/{job_id}").get_json()["status"] == "cancelled"
    assert client.get(f"/api/jobs/{job_id}/audio").status_code == 409


def test_cancelling_a_finished_job_changes_nothing(client, workers):
    job_id = client.post("/api/jobs", json={"text": "Done before the cancel."}).get_json()["id"]
    done = wait_for(client, job_id, {"done"})
    cancelled = client.delete(f"/api/jobs/{job_id}")
    assert cancelled.status_code == 200 and cancelled.get_json() == done
    assert client.get(f"/api/jobs/{job_id}/audio").status_code == 200


def test_recent_jobs_are_listed_newest_first_and_filtered_by_status(client, workers):
    first = client.post("/api/jobs", json={"text": "First."}).get_json()["id"]
    second = client.post("/api/jobs", json={"text": "Second."}).get_json()["id"]
    wait_for(client, first, {"done"})
    wait_for(client, second, {"done"})
    listed = client.get("/api/jobs?limit=2").get_json()["jobs"]
    assert [job["id"] for job in listed] == [second, first]
    assert all(job["status"] == "done" for job in client.get("/api/jobs?status=done").get_json()["jobs"])
    assert client.get("/api/jobs?status=lost").get_json()["field"] == "status"
    assert client.get("/api/jobs?limit=0").get_json()["field"] == "limit"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"text": ""}, "text"),
        ({"text": "x" * 2001}, "text"),
        ({"text": "Hi.", "speed": 12}, "speed"),
        ({"text": "Hi.", "format": "aiff"}, "format"),
        ({"text": "Hi.", "voice": True}, "voice"),
        ({"text": "Hi.", "top_p": "high"}, "top_p"),
        ({"text": "Hi.", "colour": "red"}, "colour"),
        ({"text": "Hi.", "priority": "urgent"}, "priority"),
        ([1, 2, 3], "body"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_records_no_job(client, app, body, field):
    answer = client.post("/api/jobs", json=body)
    assert answer.status_code == 400
    assert answer.get_json()["field"] == field and answer.get_json()["error"]
    with app.app_context():
        assert db.session.execute(db.select(Job)).first() is None


def test_a_job_waits_on_the_queue_of_its_priority_normal_by_default(make_app, idle_redis_url):
    client = make_app(redis_url=idle_redis_url).test_client()
    for priority in ("interactive", "bulk", "bulk"):
        assert client.post("/api/jobs", json={"text": "Hi.", "priority": priority}).status_code == 202
    assert client.post("/api/jobs", json={"text": "Hi."}).status_code == 202
    with redis.Redis.from_url(idle_redis_url) as queues:
        depths = {queue: queues.llen(queue) for queue in JOB_QUEUES}
    assert depths == {"tts.interactive": 1, "tts": 1, "celery": 0, "tts.bulk": 2}


def test_awkward_text_is_refused_at_submit_naming_text_or_spoken_to_the_end(client, workers):
    accepted = {}
    for name, (text, refusal) in EDGE_TEXTS.items():
        answer = client.post("/api/jobs", json={"text": text})
        if refusal is None:
            assert answer.status_code == 202, (name, answer.get_json())
            accepted[name] = answer.get_json()["id"]
        else:
            assert answer.status_code == 400 and answer.get_json()["field"] == "text", (name, answer.get_json())
            assert refusal in answer.get_json()["error"], name
    for name, job_id in accepted.items():
        finished = wait_for(client, job_id, {"done", "failed"})
        assert finished["status"] == "done", (name, finished["error"])
        assert client.get(finished["result"]["audio_url"]).status_code == 200, name


def test_an_unknown_catalog_voice_is_a_422(client):
    answer = client.post("/api/jobs", json={"text": "Hi.", "voice": "Nobody"})
    assert answer.status_code == 422 and answer.get_json()["field"] == "voice"
    for voice_id in (2**31, 2**40):  # past PostgreSQL's integers too
        answer = client.post("/api/jobs", json={"text": "Hi.", "voice_id": voice_id})
        assert answer.status_code == 422 and answer.get_json()["field"] == "voice_id"


def test_a_body_that_is_not_json_or_too_large_is_refused_as_json(client):
    assert client.post("/api/jobs", data="text=hi", content_type="text/plain").get_json()["field"] == "body"
    malformed = client.post("/api/jobs", data='{"text": "hi",', content_type="application/json")
    assert malformed.status_code == 400 and malformed.get_json()["field"] == "body"
    huge = client.post("/api/jobs", json={"text": "x" * 100_000})
    assert huge.status_code == 413 and huge.get_json()["field"] == "body"


def test_an_unreachable_queue_is_a_503_and_leaves_no_job(make_app):
    app = make_app(redis_url="redis://127.0.0.1:1/0")
    started = time.monotonic()
    answer = app.test_client().post("/api/jobs", json={"text": "Hi."})
    assert time.monotonic() - started < 10, "a request must not hang while Redis is away"
    assert answer.status_code == 503 and "could not be reached" in answer.get_json()["error"]
    with app.app_context():
        assert db.session.execute(db.select(Job)).scalars().all() == []


def test_a_queue_lost_between_admitting_and_sending_a_job_is_a_503_and_the_job_is_recorded_failed(make_app, redis_url):
    app = make_app(redis_url=redis_url)
    app.extensions["backends"].sender.conf.broker_url = "redis://127.0.0.1:1/0"  # the broker goes away
    answer = app.test_client().post("/api/jobs", json={"text": "Hi."})
    assert answer.status_code == 503 and "could not be reached" in answer.get_json()["error"]
    with app.app_context():
        job = db.session.execute(db.select(Job)).scalar_one()
        assert job.status == JobStatus.FAILED and "could not be reached" in job.error
    assert redis.Redis.from_url(redis_url).zscore(redis_keys.ADMISSIONS, job.id) is None


def test_a_chunked_body_past_the_limit_is_a_413_naming_body(redis_url, tmp_path):
    # Through gunicorn: a chunked body reaches the app as a stream without Content-Length.
    environment = {**os.environ, "CHATTTS_FARM_REDIS_URL": redis_url, "CHATTTS_FARM_DATA_DIR": str(tmp_path)}
    web = Web.start(free_port(), environment, "--workers", "1")
    try:

        def chunked(text_bytes):
            yield b'{"text": "'
            for start in range(0, text_bytes, 10_000):
                yield b"x" * min(10_000, text_bytes - start)
            yield b'"}'

        headers = {"Content-Type": "application/json"}
        huge = requests.post(f"{web.url}/api/jobs", data=chunked(10_000_000), headers=headers, timeout=60)
        assert huge.status_code == 413 and huge.json()["field"] == "body"
        assert requests.post(f"{web.url}/api/jobs", data=chunked(100), headers=headers, timeout=60).status_code == 202
    finally:
        web.stop()


def test_gunicorns_gevent_workers_serve_many_requests_at_once_from_postgresql(
    postgres_server, workers, tiny_settings, tmp_path
):
    """Production: one gevent web process, PostgreSQL, more requests at once than its connection pool
    holds. psycopg must let other requests run while it waits on the server (a blocked process would
    time these out), and each request give its connection back."""
    environment = {
        **os.environ,
        "CHATTTS_FARM_REDIS_URL": workers.redis_url,
        "CHATTTS_FARM_DATA_DIR": str(tmp_path),
        "CHATTTS_FARM_DATABASE_URL": postgres_server.create_database(),
        "CHATTTS_FARM_AUDIO_STORE": tiny_settings.audio_store,  # where the session's workers write
    }
    web = Web.start(free_port(), environment, "--workers", "1")  # it migrates the empty database first
    try:
        with ThreadPoolExecutor(POOL_OVERFLOWING_REQUESTS) as pool:
            job_ids = list(pool.map(lambda n: web.submit(f"Request {n} of many.", n), range(POOL_OVERFLOWING_REQUESTS)))
        wait_until(lambda: set(web.statuses(job_ids).values()) == {"done"}, 180, "every job to be done")
        audio = requests.get(f"{web.url}/api/jobs/{job_ids[0]}/audio", timeout=30)
        assert audio.status_code == 200 and decode(audio.content)[1] > 0
    finally:
        web.stop()


def test_a_request_after_postgresql_closed_every_pooled_connection_is_answered(
    tiny_settings, redis_url, tmp_path, postgres_server
):
    """A restarted or failed-over server leaves the pool's connections dead: each is checked as it is taken."""
    database_url = postgres_server.create_database()
    settings = dataclasses.replace(tiny_settings, redis_url=redis_url, data_dir=tmp_path, database_url=database_url)
    app = create_app({"TESTING": True, "SETTINGS": settings})
    with app.app_context():
        flask_migrate.upgrade()
    client = app.test_client()
    assert client.get("/api/jobs").status_code == 200
    closer = create_engine(database_url)
    with closer.connect() as connection:
        closed = connection.exec_driver_sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).scalar()
    closer.dispose()
    assert closed >= 1
    assert client.get("/api/jobs").status_code == 200
    with app.app_context():
        db.engine.dispose()


@pytest.mark.parametrize(
    "forged",
    [
        "a string",
        ["a", "list"],
        {"duration_s": "long"},
        {"duration_s": 1.0, "audio_key": "chattts:session:x"},
        {"duration_s": 1.0, "audio_key": f"{OTHER_JOB[:2]}/{OTHER_JOB}.wav", "audio_url": f"file:///{OTHER_JOB}.wav"},
    ],
    ids=["string", "list", "dict-without-audio", "another-keys-audio", "another-jobs-audio"],
)
def test_a_forged_result_in_redis_fails_the_job_with_a_clear_error(app, client, forged):
    with app.app_context():
        job = Job(id=str(uuid.uuid4()), text="Hi.", parameters={}, format="wav")
        db.session.add(job)
        db.session.commit()
        app.extensions["backends"].celery.backend.store_result(job.id, forged, "SUCCESS")
        job_id = job.id
    answer = client.get(f"/api/jobs/{job_id}")
    assert answer.status_code == 200
    assert answer.get_json()["status"] == "failed" and "malformed" in answer.get_json()["error"]
    assert client.get(f"/api/jobs/{job_id}/audio").status_code == 409
