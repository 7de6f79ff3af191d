"""The probes: what /readyz says when the farm is not ready."""

import dataclasses

from web import create_app


def test_readyz_says_redis_is_unreachable_without_the_connection_details(tiny_settings, tmp_path):
    settings = dataclasses.replace(tiny_settings, redis_url="redis://127.0.0.1:1/0", data_dir=tmp_path)
    answer = create_app({"TESTING": True, "SETTINGS": settings}).test_client().get("/readyz")
    assert answer.status_code == 503
    assert answer.get_json() == {"ready": False, "redis": False, "error": "Redis could not be reached", "workers": 0}
