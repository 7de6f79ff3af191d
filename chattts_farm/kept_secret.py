"""A random secret made once and kept in a file only its owner can read, so that every process and
every restart that reads the file shares it (the web's session-signing key, the Redis password of
``chattts-farm up``)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def kept_secret(path: Path, nbytes: int) -> str:
    """The secret in ``path``, made there first (``nbytes`` random bytes, URL-safe text) when absent."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside, then linked into place: a link never half-exists, and the first process wins.
        candidate = path.with_name(f"{path.name}.{os.getpid()}")
        descriptor = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(nbytes))
        try:
            os.link(candidate, path)
        except FileExistsError:
            pass
        finally:
            candidate.unlink()
    return path.read_text().strip()
