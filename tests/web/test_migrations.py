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


BEFORE_OWNERS = "eb663827707c"


def test_voice_owners_and_per_key_previews_upgrade_and_downgrade_keeping_the_shared_previews(app):
    """Voices made before owners existed have none; a voice's one kept preview stays its preview, for
    the key (or no key) that made it; going back keeps the previews made without a key. Copying the
    voices table (SQLite's way to change it) loses none of its tags and none of its jobs."""
    with app.app_context():
        flask_migrate.downgrade(revision=BEFORE_OWNERS)
        with db.engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO api_keys (id, name, key_hash, prefix, created_at)"
                " VALUES (1, 'alice', 'h', 'cf_', '2026-01-01')"
            )
            connection.exec_driver_sql(
                "INSERT INTO voices (id, name, spk_emb, description, rating, favourite, created_at, updated_at,"
                " preview_job_id) VALUES (1, 'Old', 'e', '', 0, 0, '2026-01-01', '2026-01-01', 'shared-preview')"
            )
            connection.exec_driver_sql("INSERT INTO tags (id, name) VALUES (1, 'calm')")
            connection.exec_driver_sql("INSERT INTO voice_tags (voice_id, tag_id) VALUES (1, 1)")
            for job_id, key_id in (("shared-preview", None), ("alices-job", 1)):
                connection.exec_driver_sql(
                    "INSERT INTO jobs (id, created_at, text, voice_id, parameters, status, progress, format,"
                    " api_key_id) VALUES (?, '2026-01-01', 'Hi.', 1, '{}', 'done', 1.0, 'wav', ?)",
                    (job_id, key_id),
                )
        flask_migrate.upgrade()
        with db.engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT owner_key_id FROM voices").all() == [(None,)]
            assert connection.exec_driver_sql("SELECT is_admin FROM api_keys").all() == [(0,)]
            previews = connection.exec_driver_sql("SELECT id, voice_id, is_preview FROM jobs ORDER BY id").all()
            assert previews == [("alices-job", 1, 0), ("shared-preview", 1, 1)]
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
