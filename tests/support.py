"""Small helpers shared by fixtures and tests."""

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from celery import Celery

from cli.local_services import free_port

WEB_START_TIMEOUT_S = 120
# The bucket of the tests' S3 server (the s3_endpoint fixture).
S3_BUCKET = "farm-audio"
CLI = str(Path(sys.executable).parent / "chattts-farm")
README = Path(__file__).resolve().parents[1] / "README.md"
# The voices OpenAI's API reference lists for /v1/audio/speech, lower-case as its SDK's examples send them.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse")


WORKER_ENVIRONMENT = {
    "CHATTTS_FARM_MODEL": "synthetic-tiny",
    "CHATTTS_FARM_MAX_JOBS_IN_FLIGHT": "4",
    # Short limits keep the SIGKILL test short: a dead worker's jobs return through the failover within
    # seconds, and at the latest after (3 + 0) * 40 + 30 = 150 s (see Settings.visibility_timeout_s;
    # no engine retries here: tests/worker/test_engine_client.py sets its own). Tiny jobs take a few
    # seconds, a batch of four long ones up to ~20 s while the suite's two processes share two cores.
    "CHATTTS_FARM_TASK_SOFT_TIME_LIMIT_S": "35",
    "CHATTTS_FARM_TASK_TIME_LIMIT_S": "40",
    "CHATTTS_FARM_UNACKED_RESTORE_INTERVAL_S": "2",
    "CHATTTS_FARM_ENGINE_RETRIES": "0",
}


@dataclass
class Workers:
    """Real CPU worker processes under `chattts-farm worker --cpu N`, on a real Redis."""

    redis_url: str
    process: subprocess.Popen
    log_path: Path

    @classmethod
    def start(cls, redis_url: str, data_dir: Path, log_path: Path, count: int, **settings: str) -> "Workers":
        """Start the workers and wait until every one answers; they log to ``log_path``. ``settings``
        are further environment variables."""
        environment = {
            **os.environ,
            **WORKER_ENVIRONMENT,
            "CHATTTS_FARM_REDIS_URL": redis_url,
            "CHATTTS_FARM_DATA_DIR": str(data_dir),
            **settings,
        }
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [CLI, "worker", "--cpu", str(count)], env=environment, stdout=log, stderr=subprocess.STDOUT
            )
        started = cls(redis_url, process, log_path)
        try:
            started.wait_for_workers(count)
        except BaseException:
            started.stop()
            raise
        return started

    def stop(self) -> None:
        """A warm shutdown: every worker finishes its batch, and the supervisor exits cleanly."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=120) == 0, self.log()[-3000:]

    @property
    def client(self) -> Celery:
        return Celery(broker=self.redis_url, backend=self.redis_url)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_workers(self, count: int, timeout: float = 180) -> list[str]:
        """Wait until ``count`` workers answer a ping; their node names."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the supervisor died:\n{self.log()[-3000:]}"
            replies = self.client.control.ping(timeout=1.0)
            if len(replies) >= count:
                return sorted(name for reply in replies for name in reply)
        raise AssertionError(f"{count} workers did not come up:\n{self.log()[-3000:]}")


@dataclass
class Web:
    """`chattts-farm web` (gunicorn) on loopback, in a process group of its own."""

    url: str
    process: subprocess.Popen

    @classmethod
    def start(cls, port: int, environment: dict[str, str], *options: str) -> "Web":
        """Start it with further `chattts-farm web` ``options`` and wait until it answers."""
        process = subprocess.Popen(
            [CLI, "web", "--host", "127.0.0.1", "--port", str(port), *options],
            env=environment,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
        )
        web = cls(f"http://127.0.0.1:{port}", process)
        try:
            wait_until(web.healthy, WEB_START_TIMEOUT_S, "the web app to answer")
        except BaseException:
            web.kill()
            raise
        return web

    def healthy(self) -> bool:
        assert self.process.poll() is None, f"the web app exited with {self.process.returncode}"
        return requests.get(self.url + "/healthz", timeout=5).status_code == 200

    def stop(self) -> None:
        """An orderly stop: gunicorn's master ends its workers."""
        self.process.terminate()
        self.process.wait(timeout=30)

    def kill(self) -> None:
        """SIGKILL to the gunicorn master and its workers at once, as when its host or container dies."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def submit(self, text: str, voice: int) -> str:
        answer = requests.post(self.url + "/api/jobs", json={"text": text, "voice": voice}, timeout=30)
        assert answer.status_code == 202, answer.text
        return answer.json()["id"]

    def statuses(self, job_ids: list[str]) -> dict[str, str]:
        answers = {job_id: requests.get(f"{self.url}/api/jobs/{job_id}", timeout=30) for job_id in job_ids}
        assert all(answer.status_code == 200 for answer in answers.values()), {
            job_id: (answer.status_code, answer.text) for job_id, answer in answers.items()
        }
        return {job_id: answer.json()["status"] for job_id, answer in answers.items()}


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except requests.RequestException:  # not listening yet, or too busy booting to answer in time
            pass
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def serve_web(workers, data_dir, database, **settings):
    """Start `chattts-farm web` (gunicorn) with its own fresh database; yields its base URL and env."""
    environment = {
        **os.environ,
        "CHATTTS_FARM_REDIS_URL": workers.redis_url,
        "CHATTTS_FARM_DATA_DIR": str(data_dir),
        "CHATTTS_FARM_DATABASE_URL": f"sqlite:///{database}",
        "CHATTTS_FARM_MODEL": "synthetic-tiny",
        **settings,
    }
    web = Web.start(free_port(), environment, "--workers", "1")
    yield web.url, environment
    web.stop()


def run_bench(module: str, *arguments: str, data_dir: Path, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m bench.<module> ARGUMENTS`` from the repository root; it must succeed."""
    finished = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *arguments],
        cwd=Path(__file__).resolve().parents[1],
        # One CPU thread: on a small shared machine torch's spinning threads made the tiny model's
        # steps 10-30x slower under load.
        env={**os.environ, "CHATTTS_FARM_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    return finished


def markdown_table(lines: list[str], header_start: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header line starts with ``header_start``, as dicts."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    columns = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(columns, (cell.strip() for cell in line.strip("|").split("|")), strict=True)))
    return rows


def readme_callback_check():
    """The README's recipe for checking a callback's signature, run as it is printed there (five lines)."""
    section = README.read_text().split("### Signed callbacks", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 5
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - the project's own documentation
    return namespace["is_from_the_farm"]
