"""API keys, per-key limits and security headers."""

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import flask_migrate
import pytest

from web import access, create_app


@pytest.fixture
def keyed_app(tiny_settings, redis_url, tmp_path):
    settings = dataclasses.replace(tiny_settings, redis_url=redis_url, data_dir=tmp_path, require_api_key=True,
                                   rate_limit_per_minute=1000, daily_audio_quota_s=1)
    app = create_app({"TESTING": True, "SETTINGS": settings})
    with app.app_context():
        flask_migrate.upgrade()
    return app


def make_key(app, name):
    with app.app_context():
        return access.create_key(name)


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def test_keys_are_required_and_checked(keyed_app):
    client = keyed_app.test_client()
    key = make_key(keyed_app, "alice")
    missing = client.post("/api/jobs", json={"text": "Hi."})
    assert missing.status_code == 401 and missing.get_json()["field"] == "Authorization"
    assert client.post("/v1/audio/speech", json={"input": "Hi.", "voice": 1}).status_code == 401
    assert client.get("/api/jobs", headers=bearer("cf_wrong")).status_code == 401
    assert client.get("/api/jobs", headers=bearer(key)).status_code == 200
    assert client.get("/api/openapi.json").status_code == 200
    with keyed_app.app_context():
        access.revoke_key("alice")
    assert client.get("/api/jobs", headers=bearer(key)).status_code == 401


def test_only_the_submitting_key_reaches_a_job_and_its_audio(keyed_app, farm):
    client = keyed_app.test_client()
    alice, bob = make_key(keyed_app, "alice"), make_key(keyed_app, "bob")
    job = client.post("/api/jobs", json={"text": "Private words."}, headers=bearer(alice)).get_json()
    assert client.get(job["status_url"], headers=bearer(bob)).status_code == 404
    assert client.get(job["audio_url"], headers=bearer(bob)).status_code == 404
    assert client.get("/api/jobs", headers=bearer(bob)).get_json()["jobs"] == []
    assert client.get(job["status_url"], headers=bearer(alice)).status_code == 200


def test_the_daily_audio_quota_answers_429_with_retry_after(keyed_app, farm):
    client = keyed_app.test_client()
    key = make_key(keyed_app, "carol")
    job = client.post("/api/jobs", json={"text": "Use up my one second of audio, please."}, headers=bearer(key))
    deadline = time.monotonic() + 60
    while client.get(job.get_json()["status_url"], headers=bearer(key)).get_json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    refused = client.post("/api/jobs", json={"text": "One more."}, headers=bearer(key))
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0


def test_the_rate_limit_answers_429_with_retry_after_across_app_instances(keyed_app, tiny_settings, redis_url, tmp_path):
    settings = dataclasses.replace(keyed_app.config["SETTINGS"], rate_limit_per_minute=3)
    key = make_key(keyed_app, "dave")
    # Two app instances (as two web processes) share the count through Redis.
    first = create_app({"TESTING": True, "SETTINGS": settings}).test_client()
    second = create_app({"TESTING": True, "SETTINGS": settings}).test_client()
    answers = [client.get("/api/jobs", headers=bearer(key)).status_code for client in (first, second, first, second)]
    assert answers[:3] == [200, 200, 200] and answers[3] == 429
    assert 1 <= int(second.get("/api/jobs", headers=bearer(key)).headers["Retry-After"]) <= 60


def test_security_headers_are_on_pages_and_api(client):
    for path in ("/", "/api/jobs"):
        headers = client.get(path).headers
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
        assert "default-src 'self'" in headers["Content-Security-Policy"]


def test_the_keys_commands_create_list_and_revoke(tmp_path):
    cli = str(Path(sys.executable).parent / "chattts-farm")
    environment = {**os.environ, "CHATTTS_FARM_DATA_DIR": str(tmp_path)}

    def run(*arguments):
        return subprocess.run([cli, *arguments], env=environment, capture_output=True, text=True)

    assert run("db", "upgrade").returncode == 0
    created = run("keys", "create", "erin")
    assert created.returncode == 0 and created.stdout.startswith("cf_")
    assert run("keys", "create", "erin").returncode != 0
    listed = run("keys", "list").stdout
    assert "erin" in listed and created.stdout.strip() not in listed and "active" in listed
    assert run("keys", "revoke", "erin").returncode == 0
    assert "revoked" in run("keys", "list").stdout
