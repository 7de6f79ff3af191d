"""The databases the web tests run on: the embedded default (SQLite) and the production one (PostgreSQL)."""

from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

DATABASES = ("sqlite", "postgresql")
# A PostgreSQL database's URL carries a password, as in production (the test server trusts local
# connections: it checks none), so a test can see that it is never shown.
SHOWN_NOWHERE = "a-password-never-shown"


def fresh_database(kind: str, request: pytest.FixtureRequest, directory: Path) -> str:
    """The URL of a new, empty database of ``kind``; SQLite's file goes into ``directory``."""
    if kind == "sqlite":
        return f"sqlite:///{directory / 'farm.db'}"
    url = make_url(request.getfixturevalue("postgres_server").create_database()).set(password=SHOWN_NOWHERE)
    return url.render_as_string(hide_password=False)
