"""The schema is built and removed by the migrations alone."""

import flask_migrate
from sqlalchemy import inspect

from tests.support import CLI
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


def test_the_db_commands_upgrade_and_downgrade_a_database(tmp_path):
    import os
    import subprocess

    environment = {**os.environ, "CHATTTS_FARM_DATA_DIR": str(tmp_path)}
    upgraded = subprocess.run([CLI, "db", "upgrade"], env=environment, capture_output=True, text=True)
    assert upgraded.returncode == 0, upgraded.stderr
    assert (tmp_path / "farm.db").exists()
    downgraded = subprocess.run([CLI, "db", "downgrade", "base"], env=environment, capture_output=True, text=True)
    assert downgraded.returncode == 0, downgraded.stderr
