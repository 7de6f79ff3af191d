"""Shared fixtures. Tests run on synthetic-tiny weights: the real ChatTTS weights cannot be had here."""

import os
from pathlib import Path

# One math thread per process: the test process and the worker processes it starts share a small
# machine, and torch's threads (one per core each) fighting over it make tiny models 10-100x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from chattts_farm.settings import Settings  # noqa: E402
from cli.local_services import free_port, start_redis_server  # noqa: E402
from tests.support import Workers  # noqa: E402


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """Where synthetic assets are built: CHATTTS_FARM_DATA_DIR when set, so runs can share one build."""
    configured = os.environ.get("CHATTTS_FARM_DATA_DIR")
    return Path(configured) if configured else tmp_path_factory.mktemp("farm-data")


@pytest.fixture(scope="session")
def tiny_assets(data_dir) -> Path:
    """The synthetic-tiny assets in the shared data dir, built once for the session."""
    from worker.synthetic_assets import ensure_synthetic_assets

    return ensure_synthetic_assets(data_dir, "tiny")


@pytest.fixture(scope="session")
def tiny_settings(data_dir) -> Settings:
    # The audio store named outright: the session's workers (data dir ``data_dir``) write there, and a
    # test's web app with a data dir of its own must read from there too.
    audio_store = f"file:{data_dir.resolve() / 'audio'}"
    return Settings.from_env({}, model="synthetic-tiny", device="cpu", data_dir=data_dir, audio_store=audio_store)


@pytest.fixture(scope="session")
def audio_store(tiny_settings):
    """The audio store the session's workers write to."""
    from chattts_farm.audio_store import from_settings

    return from_settings(tiny_settings)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real redis-server on a free port, configured as the farm needs it (noeviction), without persistence."""
    port = free_port()
    process = start_redis_server(port, tmp_path_factory.mktemp("redis"), "--save", "", "--appendonly", "no")
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(timeout=20)


@pytest.fixture(scope="session")
def workers(redis_url, data_dir, tmp_path_factory):
    """Two real CPU worker processes, shared by the session's tests."""
    running = Workers.start(redis_url, data_dir, tmp_path_factory.mktemp("farm") / "workers.log", count=2)
    yield running
    running.stop()
