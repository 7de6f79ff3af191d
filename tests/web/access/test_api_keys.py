"""API keys: required and checked on /api and /v1, each key sees only its own jobs, and the keys commands."""

import os
import subprocess

from tests.support import CLI
from tests.web.access.support import bearer, make_key
from web.access import api_keys


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
        api_keys.revoke_key("alice")
    assert client.get("/api/jobs", headers=bearer(key)).status_code == 401


def test_only_the_submitting_key_reaches_a_job_and_its_audio(keyed_app, workers):
    client = keyed_app.test_client()
    alice, bob = make_key(keyed_app, "alice"), make_key(keyed_app, "bob")
    job = client.post("/api/jobs", json={"text": "Private words."}, headers=bearer(alice)).get_json()
    assert client.get(job["status_url"], headers=bearer(bob)).status_code == 404
    assert client.get(job["audio_url"], headers=bearer(bob)).status_code == 404
    assert client.get("/api/jobs", headers=bearer(bob)).get_json()["jobs"] == []
    assert client.get(job["status_url"], headers=bearer(alice)).status_code == 200


def test_the_keys_commands_create_list_and_revoke(tmp_path):
    environment = {**os.environ, "CHATTTS_FARM_DATA_DIR": str(tmp_path)}

    def run(*arguments):
        return subprocess.run([CLI, *arguments], env=environment, capture_output=True, text=True)

    assert run("db", "upgrade").returncode == 0
    created = run("keys", "create", "erin")
    assert created.returncode == 0 and created.stdout.startswith("cf_")
    assert run("keys", "create", "erin").returncode != 0
    listed = run("keys", "list").stdout
    assert "erin" in listed and created.stdout.strip() not in listed and "active" in listed
    assert run("keys", "revoke", "erin").returncode == 0
    assert "revoked" in run("keys", "list").stdout
