"""Per-key limits: the daily audio quota and the rate limits, shared by every web process."""

import dataclasses
import time

from tests.web.access.support import bearer, make_key
from web import create_app


def test_the_daily_audio_quota_answers_429_with_retry_after(keyed_app, workers):
    client = keyed_app.test_client()
    key = make_key(keyed_app, "carol")
    job = client.post("/api/jobs", json={"text": "Use up my one second of audio, please."}, headers=bearer(key))
    deadline = time.monotonic() + 60
    while client.get(job.get_json()["status_url"], headers=bearer(key)).get_json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    refused = client.post("/api/jobs", json={"text": "One more."}, headers=bearer(key))
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0


def test_the_rate_limits_answer_429_with_retry_after_across_app_instances(keyed_app):
    settings = dataclasses.replace(keyed_app.config["SETTINGS"], rate_limit_per_minute=2, read_rate_limit_per_minute=3)
    key = make_key(keyed_app, "dave")
    if time.time() % 60 > 55:  # the counts are per clock minute: start well inside one
        time.sleep(60 - time.time() % 60)
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
