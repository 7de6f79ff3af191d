"""The key signing session cookies: one for every web process and every restart."""

from __future__ import annotations

from chattts_farm.kept_secret import kept_secret
from chattts_farm.settings import Settings


def get_or_create(settings: Settings) -> str:
    """The configured key, else one kept in the data dir (made by the first process that needs it)."""
    if settings.secret_key:
        return settings.secret_key
    return kept_secret(settings.data_dir / "secret_key", 48)
