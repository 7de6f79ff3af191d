"""Redis loses everything (FLUSHALL): the reconciler finds the unfinished jobs in the database and
enqueues them again, so none is lost."""

import dataclasses
import os
import subprocess
import time
import uuid
from datetime import timedelta

import flask_migrate
import pytest
import redis

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
        stranded = []
        for word in ("four", "five"):
            job = Job(
                id=str(uuid.uuid4()),
                text=f"Job {word} was never delivered.",
                voice_seed=3,
                parameters={"format": "wav", "speed": 5},
                format="wav",
                status=JobStatus.QUEUED,
                created_at=utcnow() - timedelta(minutes=1),
            )
            db.session.add(job)
            stranded.append(job.id)
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


def wait_for_line(log_path, line, process, timeout=60):
    deadline = time.monotonic() + timeout
    while line not in log_path.read_text():
        assert process.poll() is None, f"the reconciler exited:\n{log_path.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {line!r} in:\n{log_path.read_text()[-2000:]}"
        time.sleep(0.2)
