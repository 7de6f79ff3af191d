"""A job's audio from the audio store over HTTP: real workers write it to a directory, the web serves
it whole or in byte ranges, and ``chattts-farm gc`` deletes it (then the job) past its retention."""

import dataclasses
import os
import subprocess
import time
import uuid
from datetime import timedelta

import flask_migrate
import pytest

from tests.support import CLI
from web import create_app
from web.models import Job, JobStatus, db, utcnow
from worker.audio import decode

DAY_S = 24 * 3600


def finished_job(client, **arguments) -> dict:
    job_id = client.post("/api/jobs", json={"text": "Served from the store.", "voice": 3, **arguments}).get_json()["id"]
    deadline = time.monotonic() + 120
    while (job := client.get(f"/api/jobs/{job_id}").get_json())["status"] != "done":
        assert job["status"] in ("queued", "running") and time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


@pytest.fixture(scope="module")
def module_app(tiny_settings, redis_url, tmp_path_factory):
    """One web app for the reads of one finished job (the ``app`` fixture is one per test)."""
    settings = dataclasses.replace(tiny_settings, redis_url=redis_url, data_dir=tmp_path_factory.mktemp("serving"))
    app = create_app({"TESTING": True, "SETTINGS": settings})
    with app.app_context():
        flask_migrate.upgrade()
    return app


@pytest.fixture(scope="module")
def stored(module_app, workers, audio_store):
    """A client of the web app, a finished job, and its audio as the store holds it."""
    client = module_app.test_client()
    job = finished_job(client)
    with audio_store.open(audio_store.key(job["id"], "wav")) as audio:
        return client, job, audio.read()


def test_the_whole_audio_is_the_stored_file_with_its_validators(stored):
    client, job, data = stored
    answer = client.get(job["audio_url"])
    assert answer.status_code == 200 and answer.data == data and answer.mimetype == "audio/wav"
    assert answer.headers["Accept-Ranges"] == "bytes" and int(answer.headers["Content-Length"]) == len(data)
    assert answer.headers["ETag"] and answer.headers["Last-Modified"]
    samples, rate = decode(answer.data)
    assert abs(len(samples) / rate - job["result"]["duration_s"]) < 0.05
    head = client.head(job["audio_url"])
    assert head.status_code == 200 and head.data == b"" and int(head.headers["Content-Length"]) == len(data)


@pytest.mark.parametrize(
    ("asked", "first", "stop"),
    [
        ("bytes=0-43", 0, 44),
        ("bytes=100-", 100, None),
        ("bytes=-10", -10, None),
        ("bytes=5-999999999", 5, None),
        ("bytes=0-", 0, None),
    ],
    ids=["header", "from-an-offset", "last-bytes", "past-the-end-is-cut", "all-from-the-start"],
)
def test_a_range_is_answered_206_with_exactly_its_bytes(stored, asked, first, stop):
    client, job, data = stored
    answer = client.get(job["audio_url"], headers={"Range": asked})
    expected = data[first:stop]
    start = first % len(data)
    assert answer.status_code == 206 and answer.data == expected
    assert answer.headers["Content-Range"] == f"bytes {start}-{start + len(expected) - 1}/{len(data)}"
    assert int(answer.headers["Content-Length"]) == len(expected)


def test_a_range_past_the_end_is_416_naming_range(stored):
    client, job, data = stored
    answer = client.get(job["audio_url"], headers={"Range": f"bytes={len(data)}-"})
    assert answer.status_code == 416 and answer.get_json()["field"] == "Range"
    assert answer.headers["Content-Range"] == f"bytes */{len(data)}"


def test_several_ranges_or_a_stale_if_range_get_the_whole_audio(stored):
    client, job, data = stored
    several = client.get(job["audio_url"], headers={"Range": "bytes=0-9,20-29"})
    stale = client.get(job["audio_url"], headers={"Range": "bytes=0-9", "If-Range": '"another-version"'})
    assert several.status_code == stale.status_code == 200 and several.data == stale.data == data
    tag = client.get(job["audio_url"]).headers["ETag"]
    current = client.get(job["audio_url"], headers={"Range": "bytes=0-9", "If-Range": tag})
    assert current.status_code == 206 and current.data == data[:10]


def test_a_client_holding_the_current_version_gets_304(stored):
    client, job, _ = stored
    tag = client.get(job["audio_url"]).headers["ETag"]
    again = client.get(job["audio_url"], headers={"If-None-Match": tag})
    assert again.status_code == 304 and again.data == b""


def test_a_suffix_longer_than_the_audio_is_all_of_it_and_an_empty_one_is_416(stored):
    client, job, data = stored
    for longer in (len(data), len(data) + 1000):
        whole = client.get(job["audio_url"], headers={"Range": f"bytes=-{longer}"})
        assert whole.status_code == 206 and whole.data == data
        assert whole.headers["Content-Range"] == f"bytes 0-{len(data) - 1}/{len(data)}"
    empty = client.get(job["audio_url"], headers={"Range": "bytes=-0"})
    assert empty.status_code == 416 and empty.get_json()["field"] == "Range"
    assert empty.headers["Content-Range"] == f"bytes */{len(data)}"


def test_if_match_of_another_version_is_412_and_of_this_one_or_any_is_the_audio(stored):
    client, job, data = stored
    tag = client.get(job["audio_url"]).headers["ETag"]
    other = client.get(job["audio_url"], headers={"If-Match": '"another-version"'})
    assert other.status_code == 412 and other.get_json()["field"] == "If-Match"
    # If-Match compares strongly: the weak form of the current tag does not match it.
    weak = client.get(job["audio_url"], headers={"If-Match": f"W/{tag}"})
    assert weak.status_code == 412
    for matching in (tag, "*", f'"another-version", {tag}'):
        answer = client.get(job["audio_url"], headers={"If-Match": matching})
        assert answer.status_code == 200 and answer.data == data, matching


def test_an_if_range_with_a_weak_tag_never_holds(stored):
    client, job, data = stored
    tag = client.get(job["audio_url"]).headers["ETag"]
    weak = client.get(job["audio_url"], headers={"Range": "bytes=0-9", "If-Range": f"W/{tag}"})
    assert weak.status_code == 200 and weak.data == data


def run_gc(app, tiny_settings) -> str:
    settings = app.config["SETTINGS"]
    environment = {
        **os.environ,
        "CHATTTS_FARM_DATA_DIR": str(settings.data_dir),
        "CHATTTS_FARM_REDIS_URL": settings.redis_url,
        "CHATTTS_FARM_AUDIO_STORE": tiny_settings.audio_store,
    }
    finished = subprocess.run([CLI, "gc"], env=environment, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    return finished.stdout


def test_gc_deletes_expired_audio_then_old_jobs_and_the_web_answers_410_then_404(
    app, client, workers, audio_store, tiny_settings
):
    job = finished_job(client, format="mp3")
    path = audio_store.directory / audio_store.key(job["id"], "mp3")
    young = finished_job(client, format="mp3")
    with app.app_context():
        waiting = Job(id="still-queued", text="Old but unfinished.", parameters={}, format="wav")
        waiting.created_at = utcnow() - timedelta(days=400)
        db.session.add(waiting)
        db.session.commit()
    # Written a day and a minute ago: past the 24-hour default.
    os.utime(path, (time.time() - DAY_S - 60,) * 2)

    assert "and 0 finished job(s)" in run_gc(app, tiny_settings)
    assert not path.exists()
    gone = client.get(job["audio_url"])
    assert gone.status_code == 410 and job["id"] in gone.get_json()["error"]
    assert client.get(young["audio_url"]).status_code == 200

    # The row outlives its audio, by default 30 days after the job finished.
    with app.app_context():
        db.session.execute(db.update(Job).where(Job.id == job["id"]).values(finished_at=utcnow() - timedelta(days=31)))
        db.session.commit()
    assert "and 1 finished job(s)" in run_gc(app, tiny_settings)
    assert client.get(f"/api/jobs/{job['id']}").status_code == 404
    assert client.get(f"/api/jobs/{young['id']}").get_json()["status"] == "done"
    with app.app_context():
        assert db.session.get(Job, "still-queued").status == JobStatus.QUEUED


def test_a_web_on_the_redis_store_serves_ranges_and_410_once_the_key_expires(tiny_settings, redis_url, tmp_path):
    settings = dataclasses.replace(tiny_settings, redis_url=redis_url, data_dir=tmp_path, audio_store="redis")
    app = create_app({"TESTING": True, "SETTINGS": settings})
    job_id = str(uuid.uuid4())
    audio = bytes(range(256)) * 1000
    with app.app_context():
        flask_migrate.upgrade()
        db.session.add(Job(id=job_id, text="Kept in Redis.", parameters={}, format="wav"))
        db.session.commit()
        # Stored as a worker on the Redis store stores it: the audio, then the result naming its key.
        backends = app.extensions["backends"]
        key = backends.audio.key(job_id, "wav")
        backends.audio.write(key, audio)
        result = {"job_id": job_id, "duration_s": 1.0, "audio_key": key, "audio_url": None, "voice_embedding": None}
        backends.celery.backend.store_result(job_id, result, "SUCCESS")
    client = app.test_client()
    part = client.get(f"/api/jobs/{job_id}/audio", headers={"Range": "bytes=1000-262143"})
    assert part.status_code == 206 and part.data == audio[1000:262144] and "ETag" not in part.headers
    assert client.get(f"/api/jobs/{job_id}/audio").data == audio
    backends.redis.delete(key)
    assert client.get(f"/api/jobs/{job_id}/audio").status_code == 410
