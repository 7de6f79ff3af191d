"""A worker's engine process dies and no job is lost: a real CPU worker (synthetic-tiny) on a Redis of
the test's own, its engine process SIGKILLed with 12 jobs in flight, one of them streaming; and an
engine that cannot start says why."""

import os
import re
import signal
from pathlib import Path

import numpy as np
import psutil
import pytest

from chattts_farm.audio_store import fetch_audio
from chattts_farm.contract import PROGRESS_STATE, TASK_NAME, EngineLost, ModelUnavailable
from chattts_farm.settings import Settings
from chattts_farm.streams import stream_audio
from tests.support import Workers, wait_until
from tests.worker.test_tasks import LONG_TEXT
from worker.audio import decode
from worker.engine_client import EngineClient

JOBS = 12
SETTINGS = {
    "CHATTTS_FARM_MAX_JOBS_IN_FLIGHT": str(JOBS),
    "CHATTTS_FARM_ENGINE_RETRIES": "1",
    # The default time limits: the jobs come back from the engine's restart, not from Redis's
    # visibility timeout (3,630 s with one engine retry).
    "CHATTTS_FARM_TASK_SOFT_TIME_LIMIT_S": "600",
    "CHATTTS_FARM_TASK_TIME_LIMIT_S": "900",
}


@pytest.fixture
def worker(own_redis_url, data_dir, tmp_path):
    started = Workers.start(own_redis_url, data_dir, tmp_path / "worker.log", count=1, **SETTINGS)
    yield started
    started.stop()


def test_an_engine_that_cannot_load_its_model_says_why_where_the_worker_starts_it(monkeypatch, data_dir):
    # The engine process reads the settings from the environment it inherits, as under a real worker.
    monkeypatch.setenv("CHATTTS_FARM_MODEL", "s3://bucket")
    monkeypatch.setenv("CHATTTS_FARM_DATA_DIR", str(data_dir))
    client = EngineClient(Settings.from_env(), "cpu0", is_revoked=lambda job_id: False)
    with pytest.raises(ModelUnavailable, match="huggingface, local:<dir>, synthetic-tiny"):
        client.start()
    assert client.engine_pid is None


def health(worker) -> dict:
    return worker.client.send_task("chattts.health", queue="cpu0").get(timeout=30)


def test_an_engine_killed_with_12_jobs_in_flight_is_started_again_and_every_job_succeeds_once(worker):
    client, before = worker.client, health(worker)
    # The engine runs in a process of its own, named for its device in `ps`.
    assert before["engine_pid"] != before["pid"] and before["engine_restarts"] == 0
    assert Path(f"/proc/{before['engine_pid']}/cmdline").read_bytes().startswith(b"chattts-farm engine cpu0")
    # Its lines are in the worker's log at the worker's level (INFO), from its first start on, and so
    # are the worker's own on its start.
    warmed_up = "INFO engine cpu0 worker.engine_process.pipeline: warmed up in"
    assert worker.log().count(warmed_up) == 1
    assert f"engine process {before['engine_pid']} of cpu0 ready: 0 job(s) handed to it" in worker.log()
    assert re.search(r"INFO/MainProcess\] worker cpu0@\S+ ready: model \{'kind': 'synthetic'", worker.log())
    streaming = client.send_task(TASK_NAME, kwargs={"text": LONG_TEXT[:900], "voice": 99, "stream": True}, queue="cpu0")
    heard = iter(stream_audio(streaming.id, redis_url=worker.redis_url, timeout_s=300))
    chunks = [next(heard)]  # it streams
    jobs = [
        client.send_task(TASK_NAME, kwargs={"text": LONG_TEXT[:900], "voice": i}, queue="cpu0") for i in range(JOBS - 1)
    ]
    wait_until(lambda: all(job.state == PROGRESS_STATE for job in jobs), 60, "every job to run")
    os.kill(before["engine_pid"], signal.SIGKILL)

    outputs = all_succeed_once(worker, [streaming, *jobs])
    # The same worker process served them all, through its second engine process.
    after = health(worker)
    assert after["pid"] == before["pid"] and after["engine_restarts"] == 1
    assert after["engine_pid"] != before["engine_pid"]
    assert worker.log().count(warmed_up) == 2
    lost = f"the engine process {before['engine_pid']} of cpu0 ended (exit code -9) with {JOBS} job(s) unfinished"
    assert lost in worker.log()
    # The stream went on where it was, in the same run, and its stored audio is what was heard (the
    # worker put it together from the chunks of both engine processes).
    chunks.extend(heard)
    assert len({chunk.run for chunk in chunks}) == 1
    pcm = np.frombuffer(b"".join(chunk.pcm for chunk in chunks), dtype="<i2")
    stored, _ = decode(fetch_audio(outputs[0]))
    assert np.array_equal(pcm, np.round(stored * 32768).astype(np.int16))
    # No audio twice, none missing: it is the audio of the same job unstreamed, with its seed, up to float
    # rounding (pieces decoded in other batches than whole rows: 1e-4 at most, as in the engine process's
    # streaming tests) and a 16-bit step. A piece sent twice or missing shifts the rest.
    again = client.send_task(
        TASK_NAME, kwargs={"text": LONG_TEXT[:900], "voice": 99, "seed": outputs[0]["seed"]}, queue="cpu0"
    ).get(timeout=300)
    unstreamed, _ = decode(fetch_audio(again))
    assert unstreamed.shape == stored.shape
    assert np.abs(unstreamed - stored).max() < 1e-4 + 1 / 32768


def test_a_job_whose_engine_dies_more_often_than_the_settings_allow_fails_with_engine_lost(worker):
    client = worker.client
    job = client.send_task(TASK_NAME, kwargs={"text": LONG_TEXT[:1500]}, queue="cpu0")
    for _ in range(2):  # CHATTTS_FARM_ENGINE_RETRIES is 1: the job runs twice, then fails
        engine = health(worker)["engine_pid"]
        wait_until(lambda: job.state == PROGRESS_STATE, 60, "the job to run")
        os.kill(engine, signal.SIGKILL)
        wait_until(lambda engine=engine: health(worker)["engine_pid"] != engine, 120, "another engine process")
    with pytest.raises(EngineLost, match="died 2 times.*CHATTTS_FARM_ENGINE_RETRIES allows 1 runs again"):
        job.get(timeout=60)
    # The worker serves on.
    assert client.send_task(TASK_NAME, kwargs={"text": "Still here."}, queue="cpu0").get(timeout=120)["job_id"]


@pytest.fixture
def two_celery_processes(own_redis_url, data_dir, tmp_path):
    """One CPU worker whose engine two Celery processes feed (cpu0 started it, cpu0.1 connects)."""
    started = Workers.start(
        own_redis_url, data_dir, tmp_path / "worker.log", count=1, CHATTTS_FARM_CELERY_PROCESSES="2", **SETTINGS
    )
    started.wait_for_workers(2)
    yield started
    started.stop()  # the second Celery process stops first, while the engine it uses still runs


def twelve_running_jobs(workers) -> list:
    jobs = [
        workers.client.send_task(TASK_NAME, kwargs={"text": LONG_TEXT[:900], "voice": i}, queue="cpu0")
        for i in range(JOBS)
    ]
    wait_until(lambda: all(job.state == PROGRESS_STATE for job in jobs), 60, "every job to run")
    return jobs


def engine_processes(workers) -> list[psutil.Process]:
    return [
        process
        for process in psutil.Process(workers.process.pid).children(recursive=True)
        if process.cmdline()[:1] == ["chattts-farm engine cpu0"]
    ]


def all_succeed_once(workers, jobs) -> list[dict]:
    outputs = [job.get(timeout=300) for job in jobs]
    assert [output["job_id"] for output in outputs] == [job.id for job in jobs]
    # Celery stores a job's result before it logs the job's success: a job may be got and not yet logged.
    wait_until(lambda: all(f"[{job.id}] succeeded" in workers.log() for job in jobs), 10, "every success logged")
    for job in jobs:
        assert len(re.findall(rf"chattts\.synthesize\[{job.id}\] succeeded", workers.log())) == 1
    return outputs


def test_two_celery_processes_feed_one_engine_and_both_lose_no_job_when_it_dies(two_celery_processes):
    workers = two_celery_processes
    # The second Celery process is named for its GPU (or CPU worker) and takes the same queues.
    assert sorted(name.split("@")[0] for name in workers.wait_for_workers(2)) == ["cpu0", "cpu0.1"]
    before = health(workers)
    jobs = twelve_running_jobs(workers)
    assert [engine.pid for engine in engine_processes(workers)] == [before["engine_pid"]], "one, which both use"
    os.kill(before["engine_pid"], signal.SIGKILL)

    outputs = all_succeed_once(workers, jobs)
    # Both held jobs (each takes half of MAX_JOBS_IN_FLIGHT), and each ran its own again on the new engine.
    assert {output["worker"].split("@")[0] for output in outputs} == {"cpu0", "cpu0.1"}
    assert "waiting for the one its first Celery process starts" in workers.log()
    after = health(workers)
    assert after["engine_pid"] != before["engine_pid"] and after["engine_restarts"] == 1


def test_the_celery_process_that_started_the_engine_killed_its_jobs_and_the_others_all_succeed(
    two_celery_processes,
):
    workers = two_celery_processes
    jobs = twelve_running_jobs(workers)
    [engine] = engine_processes(workers)
    engine.parent().kill()  # the engine ends with the process that started it

    # Its supervisor starts it again, with a new engine; the other Celery process hands that engine
    # its own jobs, and the killed one's come back through the failover.
    all_succeed_once(workers, jobs)
    assert "waiting for the one its first Celery process starts" in workers.log()
    assert not engine.is_running() or engine.status() == psutil.STATUS_ZOMBIE


def test_another_celery_process_killed_leaves_the_engine_running_and_its_jobs_run_again(two_celery_processes):
    workers = two_celery_processes
    jobs = twelve_running_jobs(workers)
    [engine] = engine_processes(workers)
    [other] = [process for process in psutil.Process(workers.process.pid).children() if process != engine.parent()]
    other.kill()

    # The engine drops that process's jobs and serves on; they come back through the failover.
    all_succeed_once(workers, jobs)
    assert engine.is_running() and health(workers)["engine_restarts"] == 0
