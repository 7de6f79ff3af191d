"""Browser sessions: a browser signs in on the pages with an API key, and its session then stands for
that key. Every change a session makes must carry the page's CSRF token.

A signed-in session lives in Redis (the key's id and the session's CSRF token) for
``CHATTTS_FARM_SESSION_TTL_S`` from sign-in; the browser's cookie (Flask's, signed) carries only a random
session id. Signing out deletes the session, so a copy of the cookie is worthless from then on, and
revoking a key deletes every session signed in with it (each key keeps an index of its sessions). Before
sign-in the cookie carries the sign-in form's CSRF token instead: visitors who never sign in cost Redis
nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time

from flask import Flask, current_app, g, request, session
from flask.sessions import SecureCookieSessionInterface
from redis.exceptions import RedisError

from chattts_farm import redis_keys
from web import backends
from web.models import ApiKey

logger = logging.getLogger(__name__)

CSRF_HEADER = "X-CSRF-Token"
CSRF_FORM_FIELD = "csrf_token"
# What the cookie holds: the session id once signed in, the sign-in form's CSRF token before.
SESSION_ID = "session_id"
SIGN_IN_CSRF = "csrf"


class SessionCookie(SecureCookieSessionInterface):
    """Flask's signed cookie, marked ``Secure`` whenever the request came over https (directly, or
    through a trusted proxy: ``CHATTTS_FARM_TRUST_PROXY``), so a browser never sends it in the clear."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return super().get_cookie_secure(app) or request.is_secure


def csrf_token() -> str:
    """This browser's CSRF token: its signed-in session's, else the sign-in form's, made on first use."""
    signed_in = _signed_in_session()
    if signed_in is not None:
        return signed_in["csrf"]
    if SIGN_IN_CSRF not in session:
        session[SIGN_IN_CSRF] = secrets.token_urlsafe(32)
    return session[SIGN_IN_CSRF]


def csrf_ok(sent: str | None) -> bool:
    signed_in = _signed_in_session()
    expected = signed_in["csrf"] if signed_in is not None else session.get(SIGN_IN_CSRF)
    # Compared as bytes: compare_digest refuses str holding anything but ASCII, and a header may.
    return bool(expected and sent) and hmac.compare_digest(expected.encode(), sent.encode())


def sign_in(api_key: ApiKey) -> None:
    """Start a session standing for ``api_key``: a fresh id and CSRF token, nothing from before kept."""
    sign_out()  # a session this browser had (another key's, say) ends: no copy of its cookie lives on
    ttl_s = current_app.config["SETTINGS"].session_ttl_s
    session_id = secrets.token_urlsafe(32)
    session_hash = _hash(session_id)
    record = redis_keys.browser_session(session_hash)
    index = redis_keys.key_sessions(api_key.key_hash)
    now = time.time()
    pipeline = backends.current().redis.pipeline()
    pipeline.hset(record, mapping={"key_id": api_key.id, "csrf": secrets.token_urlsafe(32)})
    pipeline.expire(record, ttl_s)
    pipeline.zremrangebyscore(index, "-inf", now)  # sessions of this key that have expired
    pipeline.zadd(index, {session_hash: now + ttl_s})
    pipeline.expire(index, ttl_s)
    pipeline.execute()
    session[SESSION_ID] = session_id


def sign_out() -> None:
    """End this browser's session: deleted in Redis, so no copy of the cookie signs in again."""
    session_id = session.get(SESSION_ID)
    if isinstance(session_id, str):
        backends.current().redis.delete(redis_keys.browser_session(_hash(session_id)))
    session.clear()
    g.pop("browser_session", None)


def end_sessions_of(api_key: ApiKey) -> None:
    """End every browser session signed in with ``api_key`` (it is being revoked)."""
    index = redis_keys.key_sessions(api_key.key_hash)
    client = backends.current().redis
    try:
        records = [redis_keys.browser_session(session_hash.decode()) for session_hash in client.zrange(index, 0, -1)]
        client.delete(index, *records)
    except RedisError as error:
        # They cannot stand for the key anyway (every request checks that it is live); they expire.
        logger.warning("the browser sessions of key %s could not be deleted: %s", api_key.name, error)


def signed_in_key_id() -> int | None:
    """The id of the key this browser's session stands for, if it is signed in (the key may since
    have been revoked: the caller checks that it is live)."""
    signed_in = _signed_in_session()
    return int(signed_in["key_id"]) if signed_in is not None else None


def _signed_in_session() -> dict[str, str] | None:
    """This browser's session in Redis, read once a request."""
    if "browser_session" not in g:
        session_id = session.get(SESSION_ID)
        stored = (
            backends.current().redis.hgetall(redis_keys.browser_session(_hash(session_id)))
            if isinstance(session_id, str)
            else {}
        )
        g.browser_session = {name.decode(): value.decode() for name, value in stored.items()} or None
    return g.browser_session


def _hash(session_id: str) -> str:
    """Redis knows a session by its id's SHA-256: what it holds cannot be replayed as a cookie."""
    return hashlib.sha256(session_id.encode()).hexdigest()
