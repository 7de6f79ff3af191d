"""Shared fixtures. Tests run on synthetic-tiny weights: the real ChatTTS weights cannot be had here."""

import os
import subprocess
import sys
import time
from pathlib import Path

# One math thread per process: the test process and the worker processes it starts share a small
# machine, and torch's threads (one per core each) fighting over it make tiny models 10-100x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import redis  # noqa: E402
import requests  # noqa: E402

from chattts_farm.settings import Settings  # noqa: E402
from cli.local_services import free_port, start_postgres_server, start_redis_server  # noqa: E402
from tests.support import S3_BUCKET, Workers  # noqa: E402

# A database of the session's Redis that no worker reads (the farm's is 0).
IDLE_REDIS_DB = 13


def pytest_addoption(parser):
    parser.addoption(
        "--screenshots",
        metavar="DIR",
        default=None,
        help="where the page tour (tests/web/test_page_tour.py) keeps its screenshots (default: a temporary folder)",
    )


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """Where synthetic assets are built: CHATTTS_FARM_DATA_DIR when set, so runs can share one build."""
    configured = os.environ.get("CHATTTS_FARM_DATA_DIR")
    return Path(configured) if configured else tmp_path_factory.mktemp("farm-data")


@pytest.fixture(scope="session")
def tiny_assets(data_dir) -> Path:
    """The synthetic-tiny assets in the shared data dir, built once for the session."""
    from worker.model.synthetic_assets import ensure_synthetic_assets

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


@pytest.fixture
def idle_redis_url(redis_url):
    """A database of the session's Redis that no worker reads, emptied: jobs sent there stay queued."""
    url = redis_url.rsplit("/", 1)[0] + f"/{IDLE_REDIS_DB}"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server (Debian's package) for the session; tests take a fresh database each.
    Its clock is set to a zone far from UTC, so a time stored or read in the server's zone shows."""
    server = start_postgres_server(free_port(), "timezone=Pacific/Auckland")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def workers(redis_url, data_dir, tmp_path_factory):
    """Two real CPU worker processes, shared by the session's tests."""
    running = Workers.start(redis_url, data_dir, tmp_path_factory.mktemp("farm") / "workers.log", count=2)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """An S3-compatible server, moto's stand-alone one (the most faithful that installs here), with the
    bucket S3_BUCKET; the AWS variables that boto3 (here and in workers started later) reads are set."""
    import boto3

    port = free_port()
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None, "moto_server exited"
        try:
            requests.get(url, timeout=5)
            break
        # Refused until it listens; a first answer can outlast the timeout on a loaded machine (its
        # first request imports the service it serves).
        except (requests.ConnectionError, requests.Timeout):
            assert time.monotonic() < deadline, "moto_server did not answer"
            time.sleep(0.2)
    with pytest.MonkeyPatch.context() as patch:
        # Credentials come from the usual AWS variables; moto takes any.
        patch.setenv("AWS_ACCESS_KEY_ID", "farm")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "farm-secret")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket=S3_BUCKET)
        yield url
    server.terminate()
    server.wait(timeout=30)
    log.close()
