import dataclasses

import flask_migrate
import pytest

from web import create_app


@pytest.fixture
def keyed_app(tiny_settings, redis_url, tmp_path):
    settings = dataclasses.replace(
        tiny_settings,
        redis_url=redis_url,
        data_dir=tmp_path,
        require_api_key=True,
        rate_limit_per_minute=1000,
    )
    app = create_app({"TESTING": True, "SETTINGS": settings})
    with app.app_context():
        flask_migrate.upgrade()
    return app
