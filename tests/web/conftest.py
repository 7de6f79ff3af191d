import dataclasses

import flask_migrate
import pytest

from tests.web.databases import DATABASES, fresh_database
from web import create_app
from web.models import db


def pytest_generate_tests(metafunc):
    """Every test gets the embedded default database (SQLite); those marked ``database`` (the jobs, the
    catalog, keys and quotas, migrations, the reconciler) the production one (PostgreSQL) too. Not all:
    on two cores, a PostgreSQL run of every web test added about two minutes; of these, about one."""
    if "database_url" in metafunc.fixturenames:
        kinds = DATABASES if metafunc.definition.get_closest_marker("database") else DATABASES[:1]
        metafunc.parametrize("database_url", kinds, indirect=True)


@pytest.fixture
def database_url(request, tmp_path):
    """A fresh, empty database of the kind the test is parametrized with."""
    return fresh_database(request.param, request, tmp_path)


@pytest.fixture
def make_app(tiny_settings, redis_url, database_url, tmp_path):
    """Build the app on the test's database, migrated to the newest revision; ``settings`` override."""
    built = []

    def make(**settings):
        test_settings = {
            "redis_url": redis_url,
            "data_dir": tmp_path,
            "database_url": database_url,
            "max_request_bytes": 64 * 1024,
            "max_text_chars": 2000,
        }
        configured = dataclasses.replace(tiny_settings, **{**test_settings, **settings})
        app = create_app({"TESTING": True, "SETTINGS": configured})
        with app.app_context():
            flask_migrate.upgrade()
        built.append(app)
        return app

    yield make
    for app in built:  # the pools' connections would otherwise stay open until garbage collection
        with app.app_context():
            db.engine.dispose()


@pytest.fixture
def app(make_app):
    return make_app()


@pytest.fixture
def client(app):
    return app.test_client()
