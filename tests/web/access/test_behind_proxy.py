"""Behind a reverse proxy that ends TLS: with CHATTTS_FARM_TRUST_PROXY the app believes the proxy's
X-Forwarded-* headers (the session cookie is Secure, the URLs it makes are https); without it, nobody's."""

import dataclasses

import pytest
from flask import redirect, request, url_for

from web import create_app

FORWARDED = {
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "tts.example.com",
    "X-Forwarded-Port": "443",
    # A client's own (forged) entry first, then the address the proxy saw.
    "X-Forwarded-For": "10.6.6.6, 203.0.113.7",
}


@pytest.fixture
def app_behind_proxy(tiny_settings, redis_url, tmp_path):
    def build(trust_proxy: int):
        settings = dataclasses.replace(
            tiny_settings, redis_url=redis_url, data_dir=tmp_path, require_api_key=True, trust_proxy=trust_proxy
        )
        app = create_app({"TESTING": True, "SETTINGS": settings})

        @app.get("/probe")
        def probe():
            """What the app makes of the request: where it came from, and where it sends the browser."""
            response = redirect(url_for("pages.sign_in", _external=True))
            response.headers["X-Seen"] = f"{request.url} {request.remote_addr}"
            return response

        return app

    return build


def test_behind_a_trusted_proxy_the_session_cookie_is_secure_and_urls_are_https(app_behind_proxy):
    browser = app_behind_proxy(trust_proxy=1).test_client()
    sign_in = browser.get("/sign-in", headers=FORWARDED)
    assert sign_in.status_code == 200
    cookie = sign_in.headers["Set-Cookie"]
    assert cookie.startswith("session=") and "; Secure" in cookie and "; HttpOnly" in cookie

    probe = browser.get("/probe", headers=FORWARDED)
    assert probe.headers["Location"] == "https://tts.example.com/sign-in"
    # The proxy's entry, not the client's forged one.
    assert probe.headers["X-Seen"] == "https://tts.example.com/probe 203.0.113.7"


def test_without_the_setting_forwarded_headers_are_ignored(app_behind_proxy):
    browser = app_behind_proxy(trust_proxy=0).test_client()
    cookie = browser.get("/sign-in", headers=FORWARDED).headers["Set-Cookie"]
    assert cookie.startswith("session=") and "Secure" not in cookie

    probe = browser.get("/probe", headers=FORWARDED)
    assert probe.headers["Location"] == "http://localhost/sign-in"
    assert probe.headers["X-Seen"] == "http://localhost/probe 127.0.0.1"


def test_served_over_https_directly_the_session_cookie_is_secure_too(app_behind_proxy):
    browser = app_behind_proxy(trust_proxy=0).test_client()
    cookie = browser.get("/sign-in", base_url="https://localhost").headers["Set-Cookie"]
    assert "; Secure" in cookie
