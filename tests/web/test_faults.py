"""Faults the farm rides out while jobs are queued and running: Redis restarted from its append-only
file, and the web process killed and started again. Every accepted job ends done, exactly once, with
its audio downloadable."""

import os
import re
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import requests

from cli.local_services import free_port, start_redis_server
from tests.support import Web, Workers, wait_until
from worker.audio import decode

# Long enough that a batch of four takes seconds on the CPU, so a fault lands while jobs run.
LONG_TEXT = " ".join(f"Sentence {word} of a job that outlives a fault." for word in "abcdefghijklmnopqrstuvwxyz")
APPEND_ONLY = ("--appendonly", "yes", "--appendfsync", "everysec", "--save", "")


@dataclass
class RestartableRedis:
    """A redis-server of the test's own, persisting to an append-only file in ``directory``."""

    port: int
    directory: Path
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @contextmanager
    def stopped(self):
        """Redis is away inside the block and back, on the same port and files, after it (come what may)."""
        self.stop()
        try:
            yield
        finally:
            self.process = start_redis_server(self.port, self.directory, *APPEND_ONLY)

    def stop(self) -> None:
        # SIGTERM is Redis's orderly SHUTDOWN: it writes out its append-only file, then exits.
        self.process.terminate()
        assert self.process.wait(timeout=30) == 0


def some_running_and_some_queued(web: Web, job_ids: list[str]) -> bool:
    return {"running", "queued"} <= set(web.statuses(job_ids).values())


def assert_every_job_done_exactly_once(web: Web, workers: Workers, job_ids: list[str], timeout: float) -> None:
    def all_done() -> bool:
        statuses = web.statuses(job_ids)
        assert not {"failed", "cancelled"} & set(statuses.values()), statuses
        return set(statuses.values()) == {"done"}

    wait_until(all_done, timeout, "every job to be done")
    for job_id in job_ids:
        audio = requests.get(f"{web.url}/api/jobs/{job_id}/audio", timeout=30)
        assert audio.status_code == 200, audio.text
        samples, _rate = decode(audio.content)
        assert len(samples) > 0
    # Celery stores a job's result before it logs the job's success.
    wait_until(lambda: all(f"[{job_id}] succeeded" in workers.log() for job_id in job_ids), 10, "every success logged")
    log = workers.log()
    for job_id in job_ids:
        assert len(re.findall(rf"chattts\.synthesize\[{job_id}\] succeeded", log)) == 1, job_id


@pytest.fixture
def restartable_redis(tmp_path):
    directory = tmp_path / "redis"
    directory.mkdir()
    port = free_port()
    server = RestartableRedis(port, directory, start_redis_server(port, directory, *APPEND_ONLY))
    yield server
    server.stop()


@pytest.fixture
def web_environment(tmp_path, tiny_settings):
    """A web app's environment: its own data dir (and so its own SQLite database), the workers' audio
    store; add the Redis URL."""
    return {
        **os.environ,
        "CHATTTS_FARM_DATA_DIR": str(tmp_path / "web"),
        "CHATTTS_FARM_AUDIO_STORE": tiny_settings.audio_store,
    }


@pytest.fixture
def start_web(web_environment):
    """Start web processes on a Redis URL and a port; every one still running is killed at the end."""
    started: list[Web] = []

    def start(redis_url: str, port: int) -> Web:
        started.append(Web.start(port, {**web_environment, "CHATTTS_FARM_REDIS_URL": redis_url}))
        return started[-1]

    yield start
    for web in started:
        web.kill()


@pytest.fixture
def own_worker(restartable_redis, data_dir, tmp_path):
    """One CPU worker on the test's own Redis: it holds four jobs at a time, the rest wait in the queue."""
    workers = Workers.start(restartable_redis.url, data_dir, tmp_path / "workers.log", count=1)
    yield workers
    workers.stop()


def test_a_redis_restart_from_its_append_only_file_loses_no_job_and_runs_none_twice(
    restartable_redis, own_worker, start_web
):
    web = start_web(restartable_redis.url, free_port())
    job_ids = [web.submit(LONG_TEXT, voice) for voice in range(10)]
    wait_until(lambda: some_running_and_some_queued(web, job_ids), 60, "jobs both running and queued")

    with restartable_redis.stopped():
        # While Redis is away the web answers 503 (a job it cannot enqueue is refused), never a 500.
        refused = requests.post(web.url + "/api/jobs", json={"text": "Not now."}, timeout=30)
        assert refused.status_code == 503, refused.text
        for job_id in job_ids:
            assert requests.get(f"{web.url}/api/jobs/{job_id}", timeout=30).status_code in (200, 503)

    job_ids.append(web.submit("Accepted again once Redis is back.", 11))
    # Well before the visibility timeout (110 s here), which is when a job whose run the restart broke
    # would be handed out again: the jobs that were running carry on.
    assert_every_job_done_exactly_once(web, own_worker, job_ids, timeout=60)
    # And nothing is left for Redis to hand out again later: every message was acknowledged.
    with redis.Redis.from_url(restartable_redis.url) as store:
        wait_until(lambda: store.hlen("unacked") == 0 and store.llen("tts") == 0, 30, "every message acknowledged")


def test_a_web_process_killed_and_started_again_loses_no_job_and_runs_none_twice(workers, start_web):
    port = free_port()
    web = start_web(workers.redis_url, port)
    finished_before = web.submit("Done before the crash.", 1)
    wait_until(lambda: web.statuses([finished_before])[finished_before] == "done", 60, "the first job")
    job_ids = [web.submit(LONG_TEXT, voice) for voice in range(8)]
    wait_until(lambda: "running" in web.statuses(job_ids).values(), 60, "a job to run")

    web.kill()
    # The new process takes over the same port and the same database; the jobs ran on meanwhile.
    web = start_web(workers.redis_url, port)

    assert_every_job_done_exactly_once(web, workers, [finished_before, *job_ids], timeout=120)
