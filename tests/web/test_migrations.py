"""The schema is built and removed by the migrations alone."""

import flask_migrate
from sqlalchemy import inspect

from web.models import db


def tables(app):
    with app.app_context():
        return set(inspect(db.engine).get_table_names())


def test_upgrade_from_empty_creates_every_table(app):
    assert {"jobs", "voices", "tags", "voice_tags", "alembic_version"} <= tables(app)


def test_downgrade_to_base_removes_them_and_upgrade_brings_them_back(app):
    with app.app_context():
        flask_migrate.downgrade(revision="base")
    assert tables(app) <= {"alembic_version"}
    with app.app_context():
        flask_migrate.upgrade()
    assert "jobs" in tables(app)


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(app):
    with app.app_context(), db.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
