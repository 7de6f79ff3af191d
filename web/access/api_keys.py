"""API keys: made, revoked and looked up. Only a key's SHA-256 is stored; the key is shown once."""

from __future__ import annotations

import hashlib
import secrets

from web.access import sessions
from web.models import ApiKey, db, utcnow

KEY_PREFIX = "cf_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(name: str, *, admin: bool = False) -> str:
    """A new key for ``name``; the key itself is returned once and never stored. An admin key may also
    change and delete the catalog voices other keys made."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    db.session.add(ApiKey(name=name, key_hash=hash_key(key), prefix=key[:10], is_admin=admin))
    db.session.commit()
    return key


def revoke_key(name: str) -> bool:
    key = db.session.execute(db.select(ApiKey).where(ApiKey.name == name)).scalar_one_or_none()
    if key is None or key.revoked_at is not None:
        return False
    key.revoked_at = utcnow()
    db.session.commit()
    sessions.end_sessions_of(key)
    return True


def find_key(key: str) -> ApiKey | None:
    """The live (unrevoked) key row for a key as its holder types it."""
    return _live(
        db.session.execute(db.select(ApiKey).where(ApiKey.key_hash == hash_key(key.strip()))).scalar_one_or_none()
    )


def find_key_by_id(key_id: int) -> ApiKey | None:
    """The live (unrevoked) key row with this id."""
    return _live(db.session.get(ApiKey, key_id))


def _live(api_key: ApiKey | None) -> ApiKey | None:
    return api_key if api_key is not None and api_key.revoked_at is None else None
