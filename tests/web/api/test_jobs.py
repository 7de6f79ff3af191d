"""The job API, against real Redis and real CPU workers (synthetic-tiny)."""

import os
import time
import uuid

import pytest
import requests

from cli.local_services import free_port
from tests.edge_texts import EDGE_TEXTS
from tests.support import Web
from web.models import Job, JobStatus, db
from worker.audio import decode

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
        "/api/jobs", json={"text": "Hello from the web.", "voice": 42, "format": "flac", "speed": 4, "seed": 7}
    )
    assert answer.status_code == 202
    body = answer.get_json()
    assert body["status"] == "queued" and body["status_url"] == f"/api/jobs/{body['id']}"
    assert answer.headers["Location"] == body["status_url"]
    with app.app_context():
        assert db.session.get(Job, body["id"]) is not None

    done = wait_for(client, body["id"], {"done"})
    assert done["progress"] == 1.0 and done["voice"]["seed"] == 42
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
        ([1, 2, 3], "body"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_records_no_job(client, app, body, field):
    answer = client.post("/api/jobs", json=body)
    assert answer.status_code == 400
    assert answer.get_json()["field"] == field and answer.get_json()["error"]
    with app.app_context():
        assert db.session.execute(db.select(Job)).first() is None


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


def test_a_body_that_is_not_json_or_too_large_is_refused_as_json(client):
    assert client.post("/api/jobs", data="text=hi", content_type="text/plain").get_json()["field"] == "body"
    malformed = client.post("/api/jobs", data='{"text": "hi",', content_type="application/json")
    assert malformed.status_code == 400 and malformed.get_json()["field"] == "body"
    huge = client.post("/api/jobs", json={"text": "x" * 100_000})
    assert huge.status_code == 413 and huge.get_json()["field"] == "body"


def test_an_unreachable_queue_is_a_503_and_the_job_is_recorded_failed(tiny_settings, tmp_path):
    import dataclasses

    import flask_migrate

    from web import create_app

    settings = dataclasses.replace(tiny_settings, redis_url="redis://127.0.0.1:1/0", data_dir=tmp_path)
    app = create_app({"TESTING": True, "SETTINGS": settings})
    with app.app_context():
        flask_migrate.upgrade()
    started = time.monotonic()
    answer = app.test_client().post("/api/jobs", json={"text": "Hi."})
    assert time.monotonic() - started < 10, "a request must not hang while Redis is away"
    assert answer.status_code == 503 and "could not be reached" in answer.get_json()["error"]
    with app.app_context():
        job = db.session.execute(db.select(Job)).scalar_one()
        assert job.status == JobStatus.FAILED and "could not be reached" in job.error


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
