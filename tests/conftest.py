"""Shared fixtures. Tests run on synthetic-tiny weights: the real ChatTTS weights cannot be had here."""

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery

from tests.support import free_port
from worker.settings import Settings


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """Where synthetic assets are built: CHATTTS_FARM_DATA_DIR when set, so runs can share one build."""
    configured = os.environ.get("CHATTTS_FARM_DATA_DIR")
    return Path(configured) if configured else tmp_path_factory.mktemp("farm-data")


@pytest.fixture(scope="session")
def tiny_settings(data_dir) -> Settings:
    return Settings.from_env({}, model="synthetic-tiny", device="cpu", data_dir=data_dir)


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


@dataclass
class Farm:
    """Two real CPU worker processes under `chattts-farm worker --cpu 2`, on a real Redis."""

    redis_url: str
    process: subprocess.Popen
    log_path: Path

    @property
    def client(self) -> Celery:
        return Celery(broker=self.redis_url, backend=self.redis_url)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_workers(self, count: int, timeout: float = 180) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the supervisor died:\n{self.log()[-3000:]}"
            replies = self.client.control.ping(timeout=1.0)
            if len(replies) >= count:
                return sorted(name for reply in replies for name in reply)
        raise AssertionError(f"{count} workers did not come up:\n{self.log()[-3000:]}")


FARM_ENVIRONMENT = {
    "CHATTTS_FARM_MODEL": "synthetic-tiny",
    "CHATTTS_FARM_BATCH_JOBS": "4",
    # Short limits keep the SIGKILL test short: a dead worker's jobs return after
    # 2 * 30 + 30 = 90 s (see Settings.visibility_timeout_s); tiny jobs take a few seconds.
    "CHATTTS_FARM_TASK_SOFT_TIME_LIMIT_S": "25",
    "CHATTTS_FARM_TASK_TIME_LIMIT_S": "30",
    "CHATTTS_FARM_UNACKED_RESTORE_INTERVAL_S": "2",
}


@pytest.fixture(scope="session")
def farm(redis_url, data_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("farm") / "workers.log"
    environment = {**os.environ, **FARM_ENVIRONMENT, "CHATTTS_FARM_REDIS_URL": redis_url,
                   "CHATTTS_FARM_DATA_DIR": str(data_dir)}
    with log_path.open("w") as log:
        process = subprocess.Popen([str(Path(sys.executable).parent / "chattts-farm"), "worker", "--cpu", "2"],
                                   env=environment, stdout=log, stderr=subprocess.STDOUT)
    running = Farm(redis_url, process, log_path)
    running.wait_for_workers(2)
    yield running
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 0, running.log()[-3000:]
