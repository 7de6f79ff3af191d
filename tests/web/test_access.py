"""API keys, per-key limits and security headers."""

import dataclasses
import os
import re
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
    changes = [client.post("/api/jobs", json={"text": "Counted."}, headers=bearer(key)).status_code
               for client in (first, second, first)]
    assert changes == [202, 202, 429]
    refused = second.post("/api/jobs", json={"text": "Counted."}, headers=bearer(key))
    assert refused.status_code == 429 and "change" in refused.get_json()["error"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60


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


def csrf_of(page) -> str:
    return re.search(r'name="csrf-token" content="([^"]+)"', page.get_data(as_text=True)).group(1)


def signed_in(app, key):
    """A browser-like client signed in on the pages with ``key``, and its CSRF token."""
    browser = app.test_client()
    token = csrf_of(browser.get("/sign-in"))
    answer = browser.post("/sign-in", data={"key": key, "csrf_token": token, "next": "/jobs"})
    assert answer.status_code == 302 and answer.headers["Location"] == "/jobs"
    return browser, csrf_of(browser.get("/jobs"))


def test_with_keys_on_the_pages_ask_for_sign_in_and_refuse_a_wrong_key_or_a_forged_form(keyed_app):
    key = make_key(keyed_app, "erin")
    browser = keyed_app.test_client()
    for page in ("/", "/jobs", "/voices", "/ops", "/jobs/some-id"):
        answer = browser.get(page)
        assert answer.status_code == 302 and answer.headers["Location"].startswith("/sign-in?next=")
    token = csrf_of(browser.get("/sign-in"))
    assert browser.post("/sign-in", data={"key": key}).status_code == 400  # no CSRF token
    assert browser.post("/sign-in", data={"key": key, "csrf_token": "forged"}).status_code == 400
    assert browser.post("/sign-in", data={"key": "cf_wrong", "csrf_token": token}).status_code == 401
    assert browser.get("/").status_code == 302

    browser, _ = signed_in(keyed_app, key)
    home = browser.get("/")
    assert home.status_code == 200 and "erin" in home.get_data(as_text=True)
    cookie = browser.get_cookie("session")
    assert cookie.http_only and cookie.same_site == "Lax"  # out of scripts' reach, not sent cross-site
    assert browser.get("/api/jobs").status_code == 200  # the session stands for the key on the API


def test_sign_in_sends_the_browser_only_to_pages_of_this_site(keyed_app):
    key = make_key(keyed_app, "frank")
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example", "javascript:alert(1)"):
        browser = keyed_app.test_client()
        token = csrf_of(browser.get("/sign-in"))
        answer = browser.post("/sign-in", data={"key": key, "csrf_token": token, "next": target})
        assert answer.status_code == 302 and answer.headers["Location"] == "/", target


def test_a_signed_in_session_changes_nothing_without_its_csrf_token(keyed_app):
    key = make_key(keyed_app, "grace")
    browser, token = signed_in(keyed_app, key)
    body = {"text": "Only from the page itself."}
    for headers in ({}, {"X-CSRF-Token": "forged"}):
        refused = browser.post("/api/jobs", json=body, headers=headers)
        assert refused.status_code == 403 and refused.get_json()["field"] == "X-CSRF-Token"
    assert browser.get("/api/jobs").get_json()["jobs"] == []
    assert browser.post("/api/jobs", json=body, headers={"X-CSRF-Token": token}).status_code == 202
    # A bearer key is never sent by a browser on its own: it needs no token.
    assert keyed_app.test_client().post("/api/jobs", json=body, headers=bearer(key)).status_code == 202


def test_the_pages_show_a_signed_in_key_only_its_own_jobs(keyed_app):
    heidi, ivan = make_key(keyed_app, "heidi"), make_key(keyed_app, "ivan")
    job = keyed_app.test_client().post("/api/jobs", json={"text": "Heidi's words."}, headers=bearer(heidi)).get_json()
    as_heidi, _ = signed_in(keyed_app, heidi)
    as_ivan, _ = signed_in(keyed_app, ivan)
    assert job["id"] in as_heidi.get("/jobs").get_data(as_text=True)
    assert as_heidi.get(f"/jobs/{job['id']}").status_code == 200
    assert job["id"] not in as_ivan.get("/jobs").get_data(as_text=True)
    assert as_ivan.get(f"/jobs/{job['id']}").status_code == 404


def test_signing_out_or_revoking_the_key_ends_the_session(keyed_app):
    judy, mallory = make_key(keyed_app, "judy"), make_key(keyed_app, "mallory")
    browser, token = signed_in(keyed_app, judy)
    assert browser.post("/sign-out", data={}).status_code == 400  # sign-out is CSRF-protected too
    assert browser.post("/sign-out", data={"csrf_token": token}).status_code == 302
    assert browser.get("/api/jobs").status_code == 401 and browser.get("/").status_code == 302

    browser, _ = signed_in(keyed_app, mallory)
    with keyed_app.app_context():
        access.revoke_key("mallory")
    assert browser.get("/api/jobs").status_code == 401 and browser.get("/").status_code == 302


def test_with_keys_off_a_cross_site_form_post_starts_no_job(client):
    # What a hostile page can make a browser send without CORS: a form-encoded or text/plain body.
    for content_type in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data"):
        answer = client.post("/api/jobs", data="text=Speak+for+me", content_type=content_type)
        assert answer.status_code == 400 and answer.get_json()["field"] == "body", content_type
    assert client.get("/api/jobs").get_json()["jobs"] == []


def test_every_web_process_signs_sessions_with_one_kept_secret(tiny_settings, redis_url, tmp_path):
    settings = dataclasses.replace(tiny_settings, redis_url=redis_url, data_dir=tmp_path)
    first, second = (create_app({"TESTING": True, "SETTINGS": settings}) for _ in range(2))
    assert first.secret_key == second.secret_key and len(first.secret_key) >= 32
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0
    configured = create_app({"TESTING": True, "SETTINGS": dataclasses.replace(settings, secret_key="from-env")})
    assert configured.secret_key == "from-env"
