"""Helpers of the access tests: a key made on an app, the header that sends it, a signed-in browser."""

import re
import time

from web.access import api_keys


def make_key(app, name):
    with app.app_context():
        return api_keys.create_key(name)


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def csrf_of(page) -> str:
    return re.search(r'name="csrf-token" content="([^"]+)"', page.get_data(as_text=True)).group(1)


def signed_in(app, key):
    """A browser-like client signed in on the pages with ``key``, and its CSRF token."""
    browser = app.test_client()
    token = csrf_of(browser.get("/sign-in"))
    answer = browser.post("/sign-in", data={"key": key, "csrf_token": token, "next": "/jobs"})
    assert answer.status_code == 302 and answer.headers["Location"] == "/jobs"
    return browser, csrf_of(browser.get("/jobs"))


def well_inside_a_minute():
    """Wait, if need be, for a clock minute to begin: the rate limits count per clock minute."""
    if time.time() % 60 > 55:
        time.sleep(60 - time.time() % 60)
