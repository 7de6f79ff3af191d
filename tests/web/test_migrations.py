"""The schema is built and removed by the migrations alone, on SQLite and on PostgreSQL alike."""

import dataclasses
import os
import subprocess
from datetime import UTC, datetime

import flask_migrate
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import DateTime, column, create_engine, inspect, select, table, text

from tests.support import CLI
from tests.web.databases import SHOWN_NOWHERE
from web import create_app
from web.models import ApiKey, db

pytestmark = pytest.mark.database  # on SQLite and on PostgreSQL


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


def test_the_migrations_build_exactly_the_schema_the_models_declare(app):
    with app.app_context(), db.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), db.metadata) == []


def test_the_default_database_is_sqlite_in_wal_mode_with_a_busy_timeout(tiny_settings, tmp_path):
    app = create_app({"TESTING": True, "SETTINGS": dataclasses.replace(tiny_settings, data_dir=tmp_path)})
    with app.app_context(), db.engine.connect() as connection:
        assert connection.engine.url.database == str(tmp_path / "farm.db")
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000


def test_the_db_commands_upgrade_and_downgrade_the_database_the_settings_name(database_url, tmp_path):
    environment = {**os.environ, "CHATTTS_FARM_DATA_DIR": str(tmp_path), "CHATTTS_FARM_DATABASE_URL": database_url}
    engine = create_engine(database_url)
    try:
        upgraded = subprocess.run([CLI, "db", "upgrade"], env=environment, capture_output=True, text=True)
        assert upgraded.returncode == 0, upgraded.stderr
        assert "database at head" in upgraded.stdout and SHOWN_NOWHERE not in upgraded.stdout + upgraded.stderr
        assert "jobs" in inspect(engine).get_table_names()
        downgraded = subprocess.run([CLI, "db", "downgrade", "base"], env=environment, capture_output=True, text=True)
        assert downgraded.returncode == 0, downgraded.stderr
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()


BEFORE_OWNERS = "eb663827707c"


def test_voice_owners_and_per_key_previews_upgrade_and_downgrade_keeping_the_shared_previews(app):
    """Voices made before owners existed have none; a voice's one kept preview stays its preview, for
    the key (or no key) that made it; going back keeps the previews made without a key. Copying the
    voices table (SQLite's way to change it) loses none of its tags and none of its jobs."""
    with app.app_context():
        flask_migrate.downgrade(revision=BEFORE_OWNERS)
        with db.engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO api_keys (id, name, key_hash, prefix, created_at)"
                    " VALUES (1, 'alice', 'h', 'cf_', '2026-01-01')"
                )
            )
            connection.execute(
                text(
                    "INSERT INTO voices (id, name, spk_emb, description, rating, favourite, created_at,"
                    " updated_at, preview_job_id)"
                    " VALUES (1, 'Old', 'e', '', 0, :no, '2026-01-01', '2026-01-01', 'shared-preview')"
                ),
                {"no": False},
            )
            connection.execute(text("INSERT INTO tags (id, name) VALUES (1, 'calm')"))
            connection.execute(text("INSERT INTO voice_tags (voice_id, tag_id) VALUES (1, 1)"))
            connection.execute(
                text(
                    "INSERT INTO jobs (id, created_at, text, voice_id, parameters, status, progress, format,"
                    " api_key_id) VALUES (:id, '2026-01-01', 'Hi.', 1, '{}', 'done', 1.0, 'wav', :key_id)"
                ),
                [{"id": "shared-preview", "key_id": None}, {"id": "alices-job", "key_id": 1}],
            )
        flask_migrate.upgrade()
        with db.engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT owner_key_id FROM voices").all() == [(None,)]
            assert connection.exec_driver_sql("SELECT is_admin FROM api_keys").all() == [(False,)]
            previews = connection.exec_driver_sql("SELECT id, voice_id, is_preview FROM jobs ORDER BY id").all()
            assert previews == [("alices-job", 1, False), ("shared-preview", 1, True)]
            assert connection.exec_driver_sql("SELECT voice_id, tag_id FROM voice_tags").all() == [(1, 1)]
        assert "preview_job_id" not in {column["name"] for column in inspect(db.engine).get_columns("voices")}

        flask_migrate.downgrade(revision=BEFORE_OWNERS)
        with db.engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT preview_job_id FROM voices").all() == [("shared-preview",)]
            assert connection.exec_driver_sql("SELECT voice_id FROM jobs").all() == [(1,), (1,)]
            assert connection.exec_driver_sql("SELECT voice_id, tag_id FROM voice_tags").all() == [(1, 1)]
        assert "is_preview" not in {column["name"] for column in inspect(db.engine).get_columns("jobs")}
        flask_migrate.upgrade()
        assert "owner_key_id" in {column["name"] for column in inspect(db.engine).get_columns("voices")}


BEFORE_ZONES = "b123ec541096"


def test_times_written_without_a_zone_are_read_as_the_same_moment_in_utc_both_ways(app):
    """The migration that gives times their zone reads the ones already written as UTC, on PostgreSQL
    whose session zone is far from it too; going back writes them as UTC again."""
    written = datetime(2026, 1, 1, 23, 30)
    created_at = select(column("created_at", DateTime())).select_from(table("api_keys"))
    with app.app_context():
        flask_migrate.downgrade(revision=BEFORE_ZONES)
        with db.engine.begin() as connection:
            connection.execute(
                text("INSERT INTO api_keys (name, key_hash, prefix, created_at) VALUES ('alice', 'h', 'cf_', :at)"),
                {"at": written},
            )
        flask_migrate.upgrade()
        assert db.session.execute(db.select(ApiKey.created_at)).scalar_one() == written.replace(tzinfo=UTC)
        db.session.remove()
        flask_migrate.downgrade(revision=BEFORE_ZONES)
        with db.engine.connect() as connection:
            assert connection.execute(created_at).scalar_one() == written
        flask_migrate.upgrade()


def test_processes_migrating_one_postgresql_database_at_once_take_turns(postgres_server, tmp_path):
    """Web processes on several hosts, started together, each apply pending migrations first."""
    environment = {
        **os.environ,
        "CHATTTS_FARM_DATA_DIR": str(tmp_path),
        "CHATTTS_FARM_DATABASE_URL": postgres_server.create_database(),
    }
    upgrades = [
        subprocess.Popen(
            [CLI, "db", "upgrade"], env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    for upgrade in upgrades:
        _, errors = upgrade.communicate(timeout=120)
        assert upgrade.returncode == 0, errors[-2000:]
