"""`chattts-farm up`: the whole workers from one command, then stopped by SIGTERM with nothing lost."""

import os
import signal
import stat
import subprocess

import psutil
import pytest
import redis
import requests

from cli.local_services import free_port, start_redis_server
from tests.support import CLI, wait_until
from worker.audio import decode

AUTH = ("ops", "s3cret")


@pytest.fixture
def farm_up(tmp_path, tiny_assets):
    ports = {"web": free_port(), "flower": free_port(), "redis": free_port()}
    # Link the session's synthetic assets in to save a build.
    (tmp_path / "assets").symlink_to(tiny_assets.resolve().parent, target_is_directory=True)
    environment = {**os.environ, "CHATTTS_FARM_FLOWER_AUTH": ":".join(AUTH)}
    environment.pop("CHATTTS_FARM_REDIS_URL", None)
    environment.pop("CHATTTS_FARM_AUDIO_STORE", None)
    process = subprocess.Popen(
        [
            CLI,
            "up",
            "--model",
            "synthetic-tiny",
            "--port",
            str(ports["web"]),
            "--flower-port",
            str(ports["flower"]),
            "--redis-port",
            str(ports["redis"]),
            "--data-dir",
            str(tmp_path),
            "--cpu-workers",
            "1",
        ],
        env=environment,
    )
    yield process, ports
    if process.poll() is None:  # the test failed before its own SIGTERM: stop the farm, leave nothing behind
        family = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
        for leftover in psutil.wait_procs(family, timeout=30)[1]:
            leftover.kill()


def test_up_runs_the_whole_farm_and_sigterm_stops_it_losing_nothing(farm_up, tmp_path):
    process, ports = farm_up
    web = f"http://127.0.0.1:{ports['web']}"
    flower = f"http://127.0.0.1:{ports['flower']}"
    wait_until(lambda: requests.get(web + "/readyz", timeout=2).json()["ready"], 180, "a ready farm")
    ready = requests.get(web + "/readyz", timeout=5).json()
    assert ready["workers"] == 1 and ready["models"] == ["synthetic"]
    children = psutil.Process(process.pid).children()
    assert any(child.cmdline()[-2:] == ["gc", "--loop"] for child in children), "up runs no gc"

    job = requests.post(web + "/api/jobs", json={"text": "Hello from up.", "voice": 5}, timeout=10).json()
    wait_until(lambda: requests.get(web + job["status_url"], timeout=5).json()["status"] == "done", 120, "the job")
    audio = requests.get(web + job["audio_url"], timeout=10)
    samples, rate = decode(audio.content)
    assert rate == 24_000 and len(samples) > 0

    metrics = requests.get(web + "/metrics", timeout=10).text
    assert 'chattts_jobs{status="done"} 1.0' in metrics
    assert "chattts_workers_online 1.0" in metrics and 'chattts_queue_depth{queue="tts"}' in metrics
    assert "chattts_queue_wait_seconds_count 1.0" in metrics
    ops = requests.get(web + "/api/ops", timeout=10).json()
    assert ops["workers"][0]["worker"].startswith("cpu0@") and "tts" in ops["queues"]
    assert requests.get(web + "/ops", timeout=10).status_code == 200

    assert requests.get(flower + "/api/workers", timeout=10).status_code == 401
    wait_until(
        lambda: any(
            name.startswith("cpu0@")
            for name in requests.get(flower + "/api/workers?refresh=1", auth=AUTH, timeout=10).json()
        ),
        60,
        "Flower's workers",
    )
    assert requests.get(flower + "/metrics", auth=AUTH, timeout=10).status_code == 200

    # The Redis that up runs wants the password it made for this data dir, kept where only we read it.
    password_file = tmp_path / "redis" / "password"
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    with redis.Redis(port=ports["redis"]) as stranger, pytest.raises(redis.AuthenticationError):
        stranger.ping()
    assert password_file.read_text() not in " ".join(
        arg for p in psutil.process_iter(["cmdline"]) for arg in p.info["cmdline"] or []
    )

    # A job in flight when SIGTERM arrives still finishes: workers end their batch first.
    in_flight = requests.post(web + "/api/jobs", json={"text": "Finish me before you stop. " * 10}, timeout=10).json()
    wait_until(
        lambda: requests.get(web + in_flight["status_url"], timeout=5).json()["status"] == "running",
        60,
        "the job to start",
    )
    family = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=180) == 0
    _gone, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"still running: {[p.cmdline() for p in alive]}"
    aof = tmp_path / "redis" / "appendonlydir"
    assert aof.exists()
    # Its audio is in the audio store, by default the data dir's audio directory.
    assert list((tmp_path / "audio").glob(f"*/{in_flight['id']}.wav"))
    # Restart only Redis from its append-only file: the finished job's result is there.
    password = password_file.read_text()
    server = start_redis_server(ports["redis"], tmp_path / "redis", "--appendonly", "yes", password=password)
    try:
        with redis.Redis(port=ports["redis"], password=password) as client:
            assert client.exists(f"celery-task-meta-{in_flight['id']}")
    finally:
        server.terminate()
        server.wait()
