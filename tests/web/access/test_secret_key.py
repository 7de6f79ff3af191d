"""The key signing session cookies: configured, or kept in the data dir for every web process."""

import dataclasses

from web import create_app


def test_every_web_process_signs_sessions_with_one_kept_secret(tiny_settings, redis_url, tmp_path):
    settings = dataclasses.replace(tiny_settings, redis_url=redis_url, data_dir=tmp_path)
    first, second = (create_app({"TESTING": True, "SETTINGS": settings}) for _ in range(2))
    assert first.secret_key == second.secret_key and len(first.secret_key) >= 32
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0
    configured = create_app({"TESTING": True, "SETTINGS": dataclasses.replace(settings, secret_key="from-env")})
    assert configured.secret_key == "from-env"
