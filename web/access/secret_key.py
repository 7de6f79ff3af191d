"""The key signing session cookies: one for every web process and every restart."""

from __future__ import annotations

import os
import secrets

from chattts_farm.settings import Settings


def get_or_create(settings: Settings) -> str:
    """The configured key, else one kept in the data dir (made by the first process that needs it)."""
    if settings.secret_key:
        return settings.secret_key
    path = settings.data_dir / "secret_key"
    if not path.exists():
        # Written aside, then linked into place: a link never half-exists, and the first process wins.
        candidate = path.with_name(f"secret_key.{os.getpid()}")
        descriptor = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(48))
        try:
            os.link(candidate, path)
        except FileExistsError:
            pass
        finally:
            candidate.unlink()
    return path.read_text().strip()
