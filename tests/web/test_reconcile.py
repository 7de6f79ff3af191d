"""Redis loses everything (FLUSHALL): the reconciler finds the unfinished jobs in the database and
enqueues them again, so none is lost."""

import dataclasses
import json
import os
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import flask_migrate
import pytest
import redis

from chattts_farm import redis_keys
from cli.local_services import free_port, start_redis_server
from tests.support import CLI
from web import create_app, reconcile
from web.models import Job, JobStatus, db, utcnow

pytestmark = pytest.mark.database  # on SQLite and on PostgreSQL


def wait_done(client, job_ids, timeout=120):
    deadline = time.monotonic() + timeout
    for job_id in job_ids:
        while client.get(f"/api/jobs/{job_id}").get_json()["status"] != "done":
            assert time.monotonic() < deadline, f"job {job_id} was lost"
            time.sleep(0.2)
        assert client.get(f"/api/jobs/{job_id}/audio").status_code == 200


def test_jobs_lost_by_redis_are_enqueued_again_and_every_one_completes(app, client, workers):
    submitted = [
        client.post("/api/jobs", json={"text": f"Job {word} must survive a wipe."}).get_json()["id"]
        for word in ("one", "two", "three")
    ]
    # Accepted jobs whose messages Redis no longer has (as after a wipe that came before delivery).
    with app.app_context():
        stranded = [stranded_job(f"Job {word} was never delivered.") for word in ("four", "five")]
        db.session.commit()
    redis.Redis.from_url(workers.redis_url).flushall()
    time.sleep(reconcile.GRACE.total_seconds())
    with app.app_context():
        resent = reconcile.reconcile()
    assert set(stranded) <= set(resent) <= set(stranded + submitted)
    wait_done(client, submitted + stranded)
    with app.app_context():
        assert reconcile.reconcile() == []  # once all are done, nothing is sent again


def test_a_job_still_in_its_queue_or_running_is_not_sent_again(app, client, workers, monkeypatch):
    monkeypatch.setattr(reconcile, "GRACE", timedelta(0))
    job_id = client.post("/api/jobs", json={"text": "Waiting patiently."}).get_json()["id"]
    with app.app_context():
        assert job_id not in reconcile.reconcile()
    wait_done(client, [job_id])


def test_the_reconciler_outlives_a_redis_outage_and_resends_once_redis_is_back(tiny_settings, tmp_path):
    port = free_port()
    settings = dataclasses.replace(tiny_settings, data_dir=tmp_path, redis_url=f"redis://127.0.0.1:{port}/0")
    app = create_app({"SETTINGS": settings})
    stranded = str(uuid.uuid4())
    with app.app_context():
        flask_migrate.upgrade()
        db.session.add(
            Job(
                id=stranded,
                text="Sent again once Redis is back.",
                voice_seed=3,
                parameters={"format": "wav", "speed": 5},
                format="wav",
                status=JobStatus.QUEUED,
                created_at=utcnow() - timedelta(minutes=1),
            )
        )
        db.session.commit()
    environment = {**os.environ, "CHATTTS_FARM_DATA_DIR": str(tmp_path), "CHATTTS_FARM_REDIS_URL": settings.redis_url}
    log_path = tmp_path / "reconciler.log"
    with log_path.open("w") as log:
        reconciler = subprocess.Popen(
            [CLI, "reconcile", "--every", "1"], env=environment, stdout=log, stderr=subprocess.STDOUT
        )
    server = None
    try:
        wait_for_line(log_path, "Redis could not be reached", reconciler)
        (tmp_path / "redis").mkdir()
        server = start_redis_server(port, tmp_path / "redis")
        wait_for_line(log_path, f"re-enqueued 1 lost job(s): {stranded}", reconciler)
        assert redis.Redis(port=port).llen("tts") == 1
    finally:
        reconciler.terminate()
        reconciler.wait(timeout=30)
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


@pytest.fixture
def lost_to_redis(tiny_settings, tmp_path, monkeypatch):
    """An app on a Redis of its own, three jobs Redis has lost, and a slow look at the database (the
    window in which two reconcilers without a lock would both find the same jobs lost)."""
    port = free_port()
    server = start_redis_server(port, tmp_path / "redis")
    settings = dataclasses.replace(tiny_settings, data_dir=tmp_path, redis_url=f"redis://127.0.0.1:{port}/0")
    app = create_app({"SETTINGS": settings})
    with app.app_context():
        flask_migrate.upgrade()
        stranded = [stranded_job(f"Lost job {n}.") for n in range(3)]
        db.session.commit()
    find_lost = reconcile.lost_jobs

    def slowly_find_lost() -> list[Job]:
        lost = find_lost()
        time.sleep(1)
        return lost

    monkeypatch.setattr(reconcile, "lost_jobs", slowly_find_lost)
    yield app, redis.Redis(port=port), stranded
    server.terminate()
    server.wait(timeout=30)


def queued_ids(store: redis.Redis) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in store.lrange("tts", 0, -1)]


def test_two_reconcilers_at_once_send_each_lost_job_once(lost_to_redis):
    app, store, stranded = lost_to_redis
    both_ready = threading.Barrier(2)

    def reconciler() -> list[str]:
        with app.app_context():
            both_ready.wait()
            return reconcile.reconcile()

    with ThreadPoolExecutor(2) as pool:
        rounds = [pool.submit(reconciler) for _ in range(2)]
        resent = sorted(job_id for done in rounds for job_id in done.result())
    assert resent == sorted(queued_ids(store)) == sorted(stranded)
    assert not store.exists(redis_keys.RECONCILER_LOCK)  # given back for the next round


def test_a_round_that_outlasts_its_lock_still_sends_its_jobs_and_says_so(lost_to_redis, monkeypatch, caplog):
    app, store, stranded = lost_to_redis
    monkeypatch.setattr(reconcile, "LOCK_TIMEOUT_S", 0.5)
    with app.app_context():
        assert sorted(reconcile.reconcile()) == sorted(queued_ids(store)) == sorted(stranded)
    assert "a reconciler round took longer than its lock" in caplog.text


def stranded_job(text: str) -> str:
    """An accepted job, old enough to be looked at, whose message Redis does not have; its id."""
    job = Job(
        id=str(uuid.uuid4()),
        text=text,
        voice_seed=3,
        parameters={"format": "wav", "speed": 5},
        format="wav",
        status=JobStatus.QUEUED,
        created_at=utcnow() - timedelta(minutes=1),
    )
    db.session.add(job)
    return job.id


def wait_for_line(log_path, line, process, timeout=60):
    deadline = time.monotonic() + timeout
    while line not in log_path.read_text():
        assert process.poll() is None, f"the reconciler exited:\n{log_path.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {line!r} in:\n{log_path.read_text()[-2000:]}"
        time.sleep(0.2)
