"""The worker runtime and Redis: its own client (audio, heartbeats), and a shutdown while Redis is away."""

import dataclasses
import functools
import json
import signal
import threading
import time

import redis

from chattts_farm import ops_series
from chattts_farm.contract import PROGRESS_STATE, TASK_NAME
from chattts_farm.redis_keys import UNACKED_HASH
from cli.local_services import free_port, start_redis_server
from tests.support import Workers, wait_until
from worker.runtime import SHUTDOWN_REDIS_GRACE_S, redis_client

# Long enough that the job still runs when its worker is asked to stop.
LONG_TEXT = " ".join(f"Sentence {word} of a job cut short by a shutdown." for word in "abcdefghijklmnopqrstuvwxyz")


def test_an_audio_write_waits_out_a_redis_restart_instead_of_failing(tiny_settings, tmp_path):
    port = free_port()
    server = start_redis_server(port, tmp_path, "--appendonly", "yes")
    client = redis_client(dataclasses.replace(tiny_settings, redis_url=f"redis://127.0.0.1:{port}/0"))
    client.ping()
    server.terminate()
    server.wait(timeout=20)

    outcome = {}
    writer = threading.Thread(target=lambda: outcome.update(written=client.set("chattts:audio:job", b"RIFF")))
    writer.start()
    time.sleep(2)  # the write is in flight while Redis is down
    assert writer.is_alive()
    server = start_redis_server(port, tmp_path, "--appendonly", "yes")
    try:
        writer.join(timeout=30)
        assert outcome == {"written": True} and client.get("chattts:audio:job") == b"RIFF"
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_a_warm_shutdown_with_redis_away_gives_up_within_seconds_and_leaves_its_jobs_unacknowledged(data_dir, tmp_path):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    # Redis's data survives its stop in its append-only file, as in production.
    start_redis = functools.partial(
        start_redis_server, port, tmp_path / "redis", "--appendonly", "yes", "--appendfsync", "always", "--save", ""
    )
    server = start_redis()
    workers = Workers.start(url, data_dir, tmp_path / "workers.log", count=1)
    try:
        job = workers.client.send_task(TASK_NAME, kwargs={"text": LONG_TEXT})
        wait_until(lambda: job.state == PROGRESS_STATE, 60, "the job to run")
        server.terminate()
        assert server.wait(timeout=20) == 0

        asked_at = time.monotonic()
        workers.process.send_signal(signal.SIGTERM)
        assert workers.process.wait(timeout=60) == 0
        assert time.monotonic() - asked_at < SHUTDOWN_REDIS_GRACE_S + 10
        assert "Redis is unreachable" in workers.log()

        server = start_redis()
        unacknowledged = redis.Redis.from_url(url).hvals(UNACKED_HASH)
        assert [json.loads(entry)[0]["headers"]["id"] for entry in unacknowledged] == [job.id]
    finally:
        if workers.process.poll() is None:  # it did not give up: it finishes once Redis is back
            if server.poll() is not None:
                server = start_redis()
            workers.stop()
        server.terminate()
        server.wait(timeout=20)


def test_workers_chart_their_finished_jobs_and_time_a_streamed_jobs_first_chunk(workers):
    client = redis.Redis.from_url(workers.redis_url)
    streamed = workers.client.send_task(TASK_NAME, kwargs={"text": "Time my first chunk.", "stream": True})
    result = streamed.get(timeout=60)

    assert 0 < result["timings"]["first_chunk_s"] < result["finished_at"] - result["started_at"]
    # Of the first chunk's wait, the engine process's share: until it sent the audio to this worker.
    assert 0 < result["timings"]["first_chunk_engine_s"] <= result["timings"]["first_chunk_s"]

    def charted() -> bool:
        return any(ops_series.read(client, time.time())["first_chunk"]["p95_s"])

    wait_until(charted, timeout=15, what="the first chunk's latency in the workers' history")
    series = ops_series.read(client, time.time())
    assert any(series["jobs_per_s"]) and any(series["audio_s_per_s"])
    assert series["gpus"] == {}  # CPU workers
    assert set(series["queues"]) >= {"tts", "cpu0", "cpu1"}
