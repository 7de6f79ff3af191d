"""Browser sessions: sign-in on the pages with a key, the CSRF token on every change, sign-out."""

import os
import subprocess

from chattts_farm import redis_keys
from tests.support import CLI
from tests.web.access.support import bearer, csrf_of, make_key, signed_in


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


def test_sign_in_sends_the_browser_only_to_pages_of_this_site_and_refuses_any_other_place(keyed_app):
    key = make_key(keyed_app, "frank")
    redis = keyed_app.extensions["backends"].redis
    elsewhere = ("https://evil.example/", "//evil.example/", "/\\evil.example", "javascript:alert(1)")
    # A CR or LF would split the Location header (Werkzeug refuses it: it was a 500, a session signed in).
    with_control_characters = ("/\r\nSet-Cookie: a=b", "/jobs\n", "/jobs\x00", "/jobs\tx", "/jobs\x7f")

    def sessions() -> set[bytes]:
        # Only the sessions' keys: the Celery broker's share of this Redis (kombu's unacked_mutex) comes and goes.
        return {*redis.keys(redis_keys.browser_session("*")), *redis.keys(redis_keys.key_sessions("*"))}

    for target in elsewhere + with_control_characters:
        browser = keyed_app.test_client()
        token = csrf_of(browser.get("/sign-in"))
        before = sessions()

        answer = browser.post("/sign-in", data={"key": key, "csrf_token": token, "next": target})

        assert answer.status_code == 400 and "not a page of this site" in answer.get_data(as_text=True), repr(target)
        assert 'name="next" value="/"' in answer.get_data(as_text=True)
        assert sessions() == before, repr(target)  # no session written
        assert browser.get("/").status_code == 302
    assert keyed_app.test_client().get("/sign-in", query_string={"next": "/\r\nX: y"}).status_code == 400
    browser = keyed_app.test_client()
    token = csrf_of(browser.get("/sign-in"))
    home = browser.post("/sign-in", data={"key": key, "csrf_token": token})
    assert home.status_code == 302 and home.headers["Location"] == "/"
    assert sessions() > before  # a sign-in that succeeds writes what the refused ones did not


def test_a_signed_in_session_changes_nothing_without_its_csrf_token(keyed_app):
    key = make_key(keyed_app, "grace")
    browser, token = signed_in(keyed_app, key)
    body = {"text": "Only from the page itself."}
    for headers in ({}, {"X-CSRF-Token": "forged"}, {"X-CSRF-Token": "forgé"}):
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


def replayed(app, cookie, token):
    """What a thief holding a copy of a browser's session cookie and CSRF token gets when submitting a job."""
    thief = app.test_client()
    thief.set_cookie("session", cookie)
    return thief.post("/api/jobs", json={"text": "Replayed."}, headers={"X-CSRF-Token": token})


def test_the_session_cookie_carries_only_a_random_session_id(keyed_app):
    browser, _ = signed_in(keyed_app, make_key(keyed_app, "ken"))
    cookie = keyed_app.session_interface.get_signing_serializer(keyed_app).loads(browser.get_cookie("session").value)
    assert list(cookie) == ["session_id"] and len(cookie["session_id"]) >= 43  # 256 random bits


def test_signing_out_ends_the_session_even_for_a_copy_of_its_cookie(keyed_app):
    browser, token = signed_in(keyed_app, make_key(keyed_app, "judy"))
    cookie = browser.get_cookie("session").value
    assert replayed(keyed_app, cookie, token).status_code == 202
    assert browser.post("/sign-out", data={}).status_code == 400  # sign-out is CSRF-protected too
    assert browser.post("/sign-out", data={"csrf_token": token}).status_code == 302
    assert browser.get("/api/jobs").status_code == 401 and browser.get("/").status_code == 302
    refused = replayed(keyed_app, cookie, token)
    assert refused.status_code == 401 and refused.get_json()["field"] == "Authorization"


def test_signing_in_again_ends_the_session_signed_in_before(keyed_app):
    browser, token = signed_in(keyed_app, make_key(keyed_app, "liam"))
    cookie = browser.get_cookie("session").value
    fresh = csrf_of(browser.get("/sign-in"))
    assert browser.post("/sign-in", data={"key": make_key(keyed_app, "mia"), "csrf_token": fresh}).status_code == 302
    assert replayed(keyed_app, cookie, token).status_code == 401
    assert "mia" in browser.get("/").get_data(as_text=True)


def test_revoking_the_key_with_keys_revoke_ends_its_sessions(keyed_app):
    browser, token = signed_in(keyed_app, make_key(keyed_app, "mallory"))
    settings = keyed_app.config["SETTINGS"]
    environment = {
        **os.environ,
        "CHATTTS_FARM_DATA_DIR": str(settings.data_dir),
        "CHATTTS_FARM_DATABASE_URL": settings.database_uri,
        "CHATTTS_FARM_REDIS_URL": settings.redis_url,
    }
    subprocess.run([CLI, "keys", "revoke", "mallory"], env=environment, check=True, capture_output=True)
    assert replayed(keyed_app, browser.get_cookie("session").value, token).status_code == 401
    assert browser.get("/api/jobs").status_code == 401 and browser.get("/").status_code == 302


def test_with_keys_off_a_cross_site_form_post_starts_no_job(client):
    # What a hostile page can make a browser send without CORS: a form-encoded or text/plain body.
    for content_type in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data"):
        answer = client.post("/api/jobs", data="text=Speak+for+me", content_type=content_type)
        assert answer.status_code == 400 and answer.get_json()["field"] == "body", content_type
    assert client.get("/api/jobs").get_json()["jobs"] == []
