"""``chattts-farm up``: the whole farm on one machine, in the foreground.

Starts (in this order) a local Redis with an append-only file under the data dir (unless a Redis URL
is given), the database migrations, the workers (one per GPU, or CPU workers), the web app under
gunicorn, Flower, the reconciler (which re-enqueues jobs Redis has lost) and the gc (which deletes
audio and jobs past their retention); prints the URLs; on Ctrl-C or SIGTERM stops the web app and
Flower, lets the workers finish their batch, then stops Redis (which flushes its append-only file).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from chattts_farm.kept_secret import kept_secret
from cli.local_services import RedisStartError, start_redis_server

logger = logging.getLogger(__name__)

RECONCILE_EVERY_S = 30


class LaunchError(RuntimeError):
    """A part of the farm could not be started; the message says what to do."""


@dataclass
class LaunchPlan:
    model: str
    host: str
    port: int
    flower_port: int
    redis_url: str | None
    redis_port: int
    data_dir: Path
    gpus: str | None
    cpu_workers: int | None


def _cli() -> list[str]:
    return [sys.executable, "-m", "cli"]


def redis_password(directory: Path) -> str:
    """The password of the Redis that ``up`` runs for this data dir: made once, kept for its restarts.

    Anyone who reaches Redis could read every job's text and audio and forge results; a password
    keeps out other local users and processes (Redis also listens on loopback only).
    """
    return kept_secret(directory / "password", 32)


class Launcher:
    def __init__(self, plan: LaunchPlan):
        self.plan = plan
        self.redis_directory = plan.data_dir.resolve() / "redis"
        self.redis_password = None if plan.redis_url else redis_password(self.redis_directory)
        self.redis_url = plan.redis_url or f"redis://:{self.redis_password}@127.0.0.1:{plan.redis_port}/0"
        self.environment = {
            **os.environ,
            "CHATTTS_FARM_MODEL": plan.model,
            "CHATTTS_FARM_DATA_DIR": str(plan.data_dir.resolve()),
            "CHATTTS_FARM_REDIS_URL": self.redis_url,
        }
        self.redis: subprocess.Popen | None = None
        self.services: dict[str, subprocess.Popen] = {}
        self.stopping = False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        self.plan.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.plan.redis_url is None:
                self._start_redis()
            self._prepare_model()
            self._run_checked([*_cli(), "db", "upgrade"], "database migrations")
            self.services["workers"] = self._spawn([*_cli(), "worker", *self._worker_placement()])
            self.services["web"] = self._spawn(
                [*_cli(), "web", "--host", self.plan.host, "--port", str(self.plan.port)]
            )
            self.services["flower"] = self._spawn(
                [*_cli(), "flower", "--address", self.plan.host, "--port", str(self.plan.flower_port)]
            )
            self.services["reconciler"] = self._spawn([*_cli(), "reconcile", "--every", str(RECONCILE_EVERY_S)])
            self.services["gc"] = self._spawn([*_cli(), "gc", "--loop"])
            self._announce()
            return self._watch()
        finally:
            self._stop_all()

    def _start_redis(self) -> None:
        # Append-only file: queued jobs and results survive a restart.
        try:
            self.redis = start_redis_server(
                self.plan.redis_port,
                self.redis_directory,
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
                new_session=True,
                password=self.redis_password,
            )
        except RedisStartError as error:
            raise LaunchError(
                f"{error}: choose another port with --redis-port, or point --redis-url at a running Redis"
            ) from None

    def _prepare_model(self) -> None:
        """Build synthetic assets here, with a progress bar, before the workers need them."""
        if self.plan.model.startswith("synthetic-"):
            self._run_checked(
                [*_cli(), "assets", "prepare", self.plan.model.removeprefix("synthetic-")], "synthetic asset build"
            )

    def _worker_placement(self) -> list[str]:
        if self.plan.cpu_workers:
            return ["--cpu", str(self.plan.cpu_workers)]
        if self.plan.gpus:
            return ["--gpus", self.plan.gpus]
        from worker.supervisor import list_gpus

        return ["--gpus", "all"] if list_gpus() else ["--cpu", "1"]

    def _spawn(self, command: list[str]) -> subprocess.Popen:
        # Sessions of their own: Ctrl-C reaches this process only, which stops the parts in order.
        return subprocess.Popen(command, env=self.environment, start_new_session=True)

    def _run_checked(self, command: list[str], what: str) -> None:
        if subprocess.run(command, env=self.environment).returncode != 0:
            raise LaunchError(f"{what} failed (see above)")

    def _announce(self) -> None:
        print(
            f"\nchattts-farm is up (model {self.plan.model}):\n"
            f"  web      http://{self.plan.host}:{self.plan.port}/\n"
            f"  flower   http://{self.plan.host}:{self.plan.flower_port}/\n"
            f"  redis    {self._shown_redis_url()}\n"
            "Ctrl-C stops everything (workers finish their current batch).\n",
            flush=True,
        )

    def _shown_redis_url(self) -> str:
        if self.redis_password is None:
            return self.redis_url
        return f"redis://127.0.0.1:{self.plan.redis_port}/0 (password in {self.redis_directory / 'password'})"

    def _watch(self) -> int:
        while not self.stopping:
            for name, process in self.services.items():
                if process.poll() is not None:
                    logger.error("%s exited with %s: stopping the farm", name, process.returncode)
                    return 1
            if self.redis is not None and self.redis.poll() is not None:
                logger.error("redis-server exited with %s: stopping the farm", self.redis.returncode)
                return 1
            time.sleep(0.5)
        return 0

    def _request_stop(self, _signum, _frame) -> None:
        self.stopping = True

    def _stop_all(self) -> None:
        for name in ("web", "flower", "reconciler", "gc", "workers"):
            process = self.services.get(name)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait()
        if self.redis is not None and self.redis.poll() is None:
            self.redis.send_signal(signal.SIGTERM)
            self.redis.wait()
