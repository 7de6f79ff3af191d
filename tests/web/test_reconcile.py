"""Redis loses everything (FLUSHALL): the reconciler finds the unfinished jobs in the database and
enqueues them again, so none is lost."""

import time
import uuid
from datetime import timedelta

import redis

from web import reconcile
from web.models import Job, JobStatus, db, utcnow


def wait_done(client, job_ids, timeout=120):
    deadline = time.monotonic() + timeout
    for job_id in job_ids:
        while client.get(f"/api/jobs/{job_id}").get_json()["status"] != "done":
            assert time.monotonic() < deadline, f"job {job_id} was lost"
            time.sleep(0.2)
        assert client.get(f"/api/jobs/{job_id}/audio").status_code == 200


def test_jobs_lost_by_redis_are_enqueued_again_and_every_one_completes(app, client, farm):
    submitted = [client.post("/api/jobs", json={"text": f"Job {word} must survive a wipe."}).get_json()["id"]
                 for word in ("one", "two", "three")]
    # Accepted jobs whose messages Redis no longer has (as after a wipe that came before delivery).
    with app.app_context():
        stranded = []
        for word in ("four", "five"):
            job = Job(id=str(uuid.uuid4()), text=f"Job {word} was never delivered.", voice_seed=3,
                      parameters={"format": "wav", "speed": 5}, format="wav", status=JobStatus.QUEUED,
                      created_at=utcnow() - timedelta(minutes=1))
            db.session.add(job)
            stranded.append(job.id)
        db.session.commit()
    redis.Redis.from_url(farm.redis_url).flushall()
    time.sleep(reconcile.GRACE.total_seconds())
    with app.app_context():
        resent = reconcile.reconcile()
    assert set(stranded) <= set(resent) <= set(stranded + submitted)
    wait_done(client, submitted + stranded)
    with app.app_context():
        assert reconcile.reconcile() == []  # once all are done, nothing is sent again


def test_a_job_still_in_its_queue_or_running_is_not_sent_again(app, client, farm, monkeypatch):
    monkeypatch.setattr(reconcile, "GRACE", timedelta(0))
    job_id = client.post("/api/jobs", json={"text": "Waiting patiently."}).get_json()["id"]
    with app.app_context():
        assert job_id not in reconcile.reconcile()
    wait_done(client, [job_id])
