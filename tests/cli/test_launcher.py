"""`chattts-farm up`: the whole farm from one command; a part killed is started again; a second `up` on
taken ports is refused before anything starts; SIGTERM stops it with nothing lost."""

import os
import signal
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import redis
import requests

from cli.local_services import free_port, start_redis_server
from tests.support import CLI, WORKER_ENVIRONMENT, wait_until
from worker.audio import decode

AUTH = ("ops", "s3cret")
# How each part of the farm shows in its process's command line.
PART_COMMANDS = {
    "redis": "redis-server",
    "workers": "-m cli worker",
    "web": "gunicorn",
    "flower": "flower",
    "reconciler": "-m cli reconcile",
}


@dataclass
class Farm:
    process: subprocess.Popen
    ports: dict[str, int]
    data_dir: Path

    @property
    def web(self) -> str:
        return f"http://127.0.0.1:{self.ports['web']}"

    @property
    def flower(self) -> str:
        return f"http://127.0.0.1:{self.ports['flower']}"

    def part(self, name: str) -> psutil.Process | None:
        """The process now running one part of the farm (a child of the launcher), if one is."""
        running = [
            child for child in psutil.Process(self.process.pid).children() if PART_COMMANDS[name] in command_line(child)
        ]
        assert len(running) <= 1, (name, [child.cmdline() for child in running])
        return running[0] if running else None

    def replaced(self, name: str, killed: psutil.Process) -> bool:
        now = self.part(name)
        return now is not None and now.pid != killed.pid

    def submit(self, text: str) -> dict:
        answer = requests.post(self.web + "/api/jobs", json={"text": text, "voice": 5}, timeout=10)
        assert answer.status_code == 202, answer.text
        return answer.json()

    def wait_done(self, job: dict, timeout: float = 120) -> None:
        wait_until(
            lambda: requests.get(self.web + job["status_url"], timeout=5).json()["status"] == "done",
            timeout,
            f"job {job['id']}",
        )


def command_line(process: psutil.Process) -> str:
    """What ``process`` runs; nothing once it has died (a zombie until the launcher notices)."""
    try:
        return " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return ""


def up_command(ports: dict[str, int], data_dir: Path) -> list[str]:
    return [
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
        str(data_dir),
        "--cpu-workers",
        "1",
    ]


def farm_environment() -> dict[str, str]:
    # The short limits of the worker tests: a job a killed worker held comes back within 90 s.
    environment = {**os.environ, **WORKER_ENVIRONMENT, "CHATTTS_FARM_FLOWER_AUTH": ":".join(AUTH)}
    environment.pop("CHATTTS_FARM_REDIS_URL", None)
    environment.pop("CHATTTS_FARM_AUDIO_STORE", None)
    return environment


@pytest.fixture(scope="module")
def farm(tmp_path_factory, tiny_assets):
    """One farm for the module's tests, which run in order: it serves, heals, refuses a second `up`, stops."""
    data_dir = tmp_path_factory.mktemp("up")
    ports = {"web": free_port(), "flower": free_port(), "redis": free_port()}
    # Link the session's synthetic assets in to save a build.
    (data_dir / "assets").symlink_to(tiny_assets.resolve().parent, target_is_directory=True)
    process = subprocess.Popen(up_command(ports, data_dir), env=farm_environment())
    running = Farm(process, ports, data_dir)
    wait_until(lambda: requests.get(running.web + "/readyz", timeout=2).json()["ready"], 180, "a ready farm")
    yield running
    if process.poll() is None:  # a test failed before the last one's SIGTERM: stop the farm, leave nothing behind
        family = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
        for leftover in psutil.wait_procs(family, timeout=30)[1]:
            leftover.kill()


def test_up_runs_the_whole_farm(farm):
    web, flower, ports = farm.web, farm.flower, farm.ports
    ready = requests.get(web + "/readyz", timeout=5).json()
    assert ready["workers"] == 1 and ready["models"] == ["synthetic"]
    children = psutil.Process(farm.process.pid).children()
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
    password_file = farm.data_dir / "redis" / "password"
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    with redis.Redis(port=ports["redis"]) as stranger, pytest.raises(redis.AuthenticationError):
        stranger.ping()
    assert password_file.read_text() not in " ".join(
        arg for p in psutil.process_iter(["cmdline"]) for arg in p.info["cmdline"] or []
    )


@pytest.mark.parametrize("name", ["reconciler", "flower", "workers", "web", "redis"])
def test_a_part_killed_is_started_again_and_no_job_is_lost(farm, name):
    victim = farm.part(name)
    its_children = victim.children(recursive=True)  # gunicorn's workers, the supervisor's Celery worker
    before = farm.submit(f"Submitted before the {name} was killed.")
    victim.kill()
    wait_until(lambda: farm.replaced(name, victim), 60, f"a new {name}")
    # They end with it (after their batch), leaving the names and ports to those of the new one.
    _gone, orphans = psutil.wait_procs(its_children, timeout=60)
    assert not orphans, [orphan.cmdline() for orphan in orphans]
    wait_until(lambda: requests.get(farm.web + "/readyz", timeout=2).json()["ready"], 120, "the farm ready again")
    after = farm.submit(f"Submitted after the {name} came back.")
    # Redis killed may lose its last second of writes: the reconciler sends such jobs again.
    farm.wait_done(before)
    farm.wait_done(after)
    wait_until(
        lambda: requests.get(farm.flower + "/api/workers", auth=AUTH, timeout=10).status_code == 200, 60, "Flower"
    )
    assert farm.process.poll() is None


def test_a_worker_killed_is_started_again_by_its_supervisor(farm):
    supervisor = farm.part("workers")
    (worker,) = supervisor.children()
    worker.kill()
    wait_until(lambda: [child.pid for child in supervisor.children()] not in ([], [worker.pid]), 60, "a new worker")
    assert farm.part("workers").pid == supervisor.pid
    farm.wait_done(farm.submit("Submitted after the worker came back."))


def test_a_second_up_on_taken_ports_says_which_before_saying_it_is_up(farm, tmp_path):
    ports = {**farm.ports, "flower": free_port()}
    second = subprocess.run(
        up_command(ports, tmp_path), env=farm_environment(), capture_output=True, text=True, timeout=60
    )
    assert second.returncode != 0 and "is up" not in second.stdout
    assert f"port {ports['web']} (web) is taken: choose another with --port" in second.stderr
    assert f"port {ports['redis']} (Redis) is taken: choose another with --redis-port" in second.stderr
    assert "Flower" not in second.stderr
    assert not (tmp_path / "farm.db").exists() and not (tmp_path / "redis" / "appendonlydir").exists()


def test_up_refuses_one_port_for_two_parts(tmp_path):
    port = free_port()
    ports = {"web": port, "flower": port, "redis": free_port()}
    finished = subprocess.run(
        up_command(ports, tmp_path), env=farm_environment(), capture_output=True, text=True, timeout=60
    )
    assert finished.returncode != 0 and "is up" not in finished.stdout
    assert f"Flower and web both want port {port}: choose another with --flower-port" in finished.stderr


def test_sigterm_stops_the_farm_losing_nothing(farm):
    process, web, ports = farm.process, farm.web, farm.ports
    password_file = farm.data_dir / "redis" / "password"
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
    aof = farm.data_dir / "redis" / "appendonlydir"
    assert aof.exists()
    # Its audio is in the audio store, by default the data dir's audio directory.
    assert list((farm.data_dir / "audio").glob(f"*/{in_flight['id']}.wav"))
    # Restart only Redis from its append-only file: the finished job's result is there.
    password = password_file.read_text()
    server = start_redis_server(ports["redis"], farm.data_dir / "redis", "--appendonly", "yes", password=password)
    try:
        with redis.Redis(port=ports["redis"], password=password) as client:
            assert client.exists(f"celery-task-meta-{in_flight['id']}")
    finally:
        server.terminate()
        server.wait()
