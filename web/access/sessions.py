"""Browser sessions: a browser signs in on the pages with an API key, and its session cookie then
stands for that key. Every change a session makes must carry the page's CSRF token."""

from __future__ import annotations

import hmac
import secrets

from flask import session

from web.access import api_keys
from web.models import ApiKey

CSRF_HEADER = "X-CSRF-Token"
CSRF_FORM_FIELD = "csrf_token"


def csrf_token() -> str:
    """This browser session's CSRF token, made on first use."""
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(32)
    return session["csrf"]


def csrf_ok(sent: str | None) -> bool:
    expected = session.get("csrf")
    return bool(expected and sent) and hmac.compare_digest(expected, sent)


def sign_in(api_key: ApiKey) -> None:
    # A fresh session (and so a fresh CSRF token): nothing set before sign-in carries over.
    session.clear()
    session["api_key_id"] = api_key.id
    csrf_token()


def sign_out() -> None:
    session.clear()


def signed_in_key() -> ApiKey | None:
    """The live key this browser session signed in with, if any."""
    key_id = session.get("api_key_id")
    return api_keys.find_key_by_id(key_id) if isinstance(key_id, int) else None
