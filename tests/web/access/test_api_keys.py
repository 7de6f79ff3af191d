"""API keys: required and checked on /api and /v1, each key sees only its own jobs, only a voice's owner
(or an admin key) changes it, each key hears its own previews, and the keys commands."""

import os
import subprocess

import pytest

from tests.support import CLI, wait_until
from tests.web.access.support import bearer, make_key
from web.access import api_keys
from web.models import Voice, db

pytestmark = pytest.mark.database  # on SQLite and on PostgreSQL

EMBEDDING = "蘁淰敕欀" * 8


def make_admin_key(app, name):
    with app.app_context():
        return api_keys.create_key(name, admin=True)


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


@pytest.fixture
def run(tmp_path, database_url):
    """``chattts-farm`` on a fresh, migrated database."""
    environment = {**os.environ, "CHATTTS_FARM_DATA_DIR": str(tmp_path), "CHATTTS_FARM_DATABASE_URL": database_url}

    def run(*arguments):
        return subprocess.run([CLI, *arguments], env=environment, capture_output=True, text=True)

    assert run("db", "upgrade").returncode == 0
    return run


def test_the_keys_commands_create_list_and_revoke(run):
    created = run("keys", "create", "erin")
    assert created.returncode == 0 and created.stdout.startswith("cf_")
    assert run("keys", "create", "erin").returncode != 0
    listed = run("keys", "list").stdout
    assert "erin" in listed and created.stdout.strip() not in listed and "active" in listed
    assert run("keys", "revoke", "erin").returncode == 0
    assert "revoked" in run("keys", "list").stdout


def test_an_admin_key_is_made_with_keys_create_admin_and_listed_as_one(run):
    created = run("keys", "create", "--admin", "root")
    assert created.returncode == 0 and created.stdout.startswith("cf_"), created.stderr
    assert run("keys", "create", "plain").returncode == 0
    roles = dict(line.split("\t")[0::4] for line in run("keys", "list").stdout.splitlines())
    assert roles == {"root": "admin", "plain": "standard"}


def test_every_key_reads_and_uses_a_voice_but_only_its_owner_or_an_admin_changes_it(keyed_app):
    client = keyed_app.test_client()
    alice, bob, root = make_key(keyed_app, "alice"), make_key(keyed_app, "bob"), make_admin_key(keyed_app, "root")
    made = client.post("/api/voices", json={"name": "Alice's", "spk_emb": EMBEDDING}, headers=bearer(alice))
    voice_url = f"/api/voices/{made.get_json()['id']}"
    assert made.get_json()["editable"] is True

    seen_by_bob = client.get(voice_url, headers=bearer(bob)).get_json()
    assert seen_by_bob["name"] == "Alice's" and seen_by_bob["editable"] is False
    spoken = client.post("/api/jobs", json={"text": "Borrowed voice.", "voice": "Alice's"}, headers=bearer(bob))
    assert spoken.status_code == 202
    for refused in (
        client.patch(voice_url, json={"name": "Bob's now"}, headers=bearer(bob)),
        client.delete(voice_url, headers=bearer(bob)),
    ):
        assert refused.status_code == 403 and refused.get_json()["field"] == "voice_id"
        assert "Alice's" in refused.get_json()["error"]
    assert client.get(voice_url, headers=bearer(bob)).get_json()["name"] == "Alice's"

    assert client.patch(voice_url, json={"rating": 4}, headers=bearer(alice)).status_code == 200
    assert client.get(voice_url, headers=bearer(root)).get_json()["editable"] is True
    assert client.patch(voice_url, json={"name": "Renamed by root"}, headers=bearer(root)).status_code == 200
    assert client.delete(voice_url, headers=bearer(root)).status_code == 204


def test_imported_voices_belong_to_the_importing_key(keyed_app):
    client = keyed_app.test_client()
    alice, bob = make_key(keyed_app, "alice"), make_key(keyed_app, "bob")
    client.post("/api/voices/import", json=[{"name": "Imported", "spk_emb": EMBEDDING}], headers=bearer(alice))
    imported = client.get("/api/voices", headers=bearer(alice)).get_json()["voices"][0]
    assert imported["editable"] is True
    assert client.delete(f"/api/voices/{imported['id']}", headers=bearer(bob)).status_code == 403
    assert client.delete(f"/api/voices/{imported['id']}", headers=bearer(alice)).status_code == 204


def test_a_voice_made_before_voices_had_owners_is_changed_only_by_admin_keys(keyed_app):
    client = keyed_app.test_client()
    alice, root = make_key(keyed_app, "alice"), make_admin_key(keyed_app, "root")
    with keyed_app.app_context():
        voice = Voice(name="Old", spk_emb=EMBEDDING)
        db.session.add(voice)
        db.session.commit()
        voice_url = f"/api/voices/{voice.id}"
    refused = client.patch(voice_url, json={"rating": 1}, headers=bearer(alice))
    assert refused.status_code == 403 and "admin" in refused.get_json()["error"]
    assert client.patch(voice_url, json={"rating": 1}, headers=bearer(root)).status_code == 200


def test_a_voice_kept_from_a_job_belongs_to_the_key_that_kept_it(keyed_app, workers):
    client = keyed_app.test_client()
    alice, bob = make_key(keyed_app, "alice"), make_key(keyed_app, "bob")
    job = client.post("/api/jobs", json={"text": "Keep my voice.", "voice": 78}, headers=bearer(alice)).get_json()
    wait_until(
        lambda: client.get(job["status_url"], headers=bearer(alice)).get_json()["status"] == "done", 60, "the job"
    )
    kept = client.post(f"/api/voices/from-job/{job['id']}", json={"name": "Kept"}, headers=bearer(alice)).get_json()
    assert client.patch(f"/api/voices/{kept['id']}", json={"rating": 2}, headers=bearer(bob)).status_code == 403
    assert client.patch(f"/api/voices/{kept['id']}", json={"rating": 2}, headers=bearer(alice)).status_code == 200


def test_each_key_hears_its_own_preview_and_never_sees_another_keys(keyed_app, workers):
    client = keyed_app.test_client()
    alice, bob = make_key(keyed_app, "alice"), make_key(keyed_app, "bob")
    voice = client.post("/api/voices", json={"name": "Shared", "seed": 79}, headers=bearer(alice)).get_json()
    preview_url = f"/api/voices/{voice['id']}/preview"

    alices = client.post(preview_url, headers=bearer(alice)).get_json()
    bobs = client.post(preview_url, headers=bearer(bob)).get_json()
    assert bobs["id"] != alices["id"]
    assert client.get(bobs["status_url"], headers=bearer(bob)).status_code == 200
    assert client.get(alices["status_url"], headers=bearer(bob)).status_code == 404
    for key, preview in ((alice, alices), (bob, bobs)):
        wait_until(
            lambda key=key, preview=preview: (
                client.get(preview["status_url"], headers=bearer(key)).get_json()["status"] == "done"
            ),
            60,
            "the preview",
        )
    # Each key's preview is kept for it while its audio lives.
    assert client.post(preview_url, headers=bearer(alice)).get_json()["id"] == alices["id"]
    assert client.post(preview_url, headers=bearer(bob)).get_json()["id"] == bobs["id"]
