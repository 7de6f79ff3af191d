"""Shared fixtures. Tests run on synthetic-tiny weights: the real ChatTTS weights cannot be had here."""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

from worker.settings import Settings


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """Where synthetic assets are built: CHATTTS_FARM_DATA_DIR when set, so runs can share one build."""
    configured = os.environ.get("CHATTTS_FARM_DATA_DIR")
    return Path(configured) if configured else tmp_path_factory.mktemp("farm-data")


@pytest.fixture(scope="session")
def tiny_settings(data_dir) -> Settings:
    return Settings.from_env({}, model="synthetic-tiny", device="cpu", data_dir=data_dir)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real redis-server on a free port, configured as the farm needs it (noeviction)."""
    server = shutil.which("redis-server")
    assert server, "redis-server is missing: scripts/test installs it (apt-get install redis-server)"
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--maxmemory-policy", "noeviction", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(timeout=20)
