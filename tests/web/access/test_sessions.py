"""Browser sessions: sign-in on the pages with a key, the CSRF token on every change, sign-out."""

import re

from tests.web.access.support import bearer, make_key
from web.access import api_keys


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
        api_keys.revoke_key("mallory")
    assert browser.get("/api/jobs").status_code == 401 and browser.get("/").status_code == 302


def test_with_keys_off_a_cross_site_form_post_starts_no_job(client):
    # What a hostile page can make a browser send without CORS: a form-encoded or text/plain body.
    for content_type in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data"):
        answer = client.post("/api/jobs", data="text=Speak+for+me", content_type=content_type)
        assert answer.status_code == 400 and answer.get_json()["field"] == "body", content_type
    assert client.get("/api/jobs").get_json()["jobs"] == []
