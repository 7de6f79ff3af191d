import pytest


@pytest.fixture
def keyed_app(make_app):
    return make_app(require_api_key=True, rate_limit_per_minute=1000)
