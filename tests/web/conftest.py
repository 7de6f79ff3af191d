import dataclasses

import flask_migrate
import pytest

from web import create_app


@pytest.fixture
def app(tiny_settings, redis_url, tmp_path):
    settings = dataclasses.replace(
        tiny_settings, redis_url=redis_url, data_dir=tmp_path, max_request_bytes=64 * 1024, max_text_chars=2000
    )
    app = create_app({"TESTING": True, "SETTINGS": settings})
    with app.app_context():
        flask_migrate.upgrade()
    return app


@pytest.fixture
def client(app):
    return app.test_client()
