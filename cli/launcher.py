"""``chattts-farm up``: the whole farm on one machine, in the foreground.

First checks that the ports it will listen on are free. Then starts (in this order) a local Redis
with an append-only file under the data dir (unless a Redis URL is given), the database migrations,
the workers (one per GPU, or CPU workers), the web app under gunicorn, Flower, the reconciler (which
re-enqueues jobs Redis has lost) and the gc (which deletes audio and jobs past their retention);
prints the URLs. A part that dies is started again after a backoff (Redis on the same port, with the
same password and append-only file; what it had not yet written there the reconciler sends again).
On Ctrl-C or SIGTERM stops the parts in the reverse order: the gc, the reconciler, the web app and
Flower, then the workers after their batch, then Redis (which flushes its file).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chattts_farm.kept_alive import KeptAlive
from chattts_farm.kept_secret import kept_secret
from cli.local_services import RedisStartError, port_is_free, start_redis_server

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
        # In the order they start; they stop in the reverse order, Redis last.
        self.parts: list[KeptAlive] = []
        self.stopping = False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        self._check_ports()
        self.plan.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.plan.redis_url is None:
                try:
                    self._keep("redis", self._start_redis, restart_errors=(RedisStartError,))
                except RedisStartError as error:
                    raise LaunchError(
                        f"{error}: choose another port with --redis-port, or point --redis-url at a running Redis"
                    ) from None
            self._prepare_model()
            self._run_checked([*_cli(), "db", "upgrade"], "database migrations")
            self._keep("workers", self._spawner("worker", *self._worker_placement()))
            self._keep("web", self._spawner("web", "--host", self.plan.host, "--port", str(self.plan.port)))
            self._keep(
                "flower",
                self._spawner("flower", "--address", self.plan.host, "--port", str(self.plan.flower_port)),
            )
            self._keep("reconciler", self._spawner("reconcile", "--every", str(RECONCILE_EVERY_S)))
            self._keep("gc", self._spawner("gc", "--loop"))
            self._announce()
            return self._watch()
        finally:
            self._stop_all()

    def _check_ports(self) -> None:
        """Every port the farm will listen on is free, or nothing starts: a farm half up is no use."""
        wanted = [
            ("web", self.plan.host, self.plan.port, "--port (or CHATTTS_FARM_PORT)"),
            ("Flower", self.plan.host, self.plan.flower_port, "--flower-port (or CHATTTS_FARM_FLOWER_PORT)"),
        ]
        if self.plan.redis_url is None:
            wanted.append(("Redis", "127.0.0.1", self.plan.redis_port, "--redis-port (or CHATTTS_FARM_REDIS_PORT)"))
        problems = []
        seen: dict[int, str] = {}
        for part, host, port, choice in wanted:
            if port in seen:
                problems.append(f"{part} and {seen[port]} both want port {port}: choose another with {choice}")
            elif not port_is_free(host, port):
                problems.append(f"port {port} ({part}) is taken: choose another with {choice}")
            seen[port] = part
        if problems:
            raise LaunchError("; ".join(problems))

    def _keep(self, name: str, start: Callable[[], subprocess.Popen], **options) -> None:
        """Start a part now and keep it alive from then on."""
        part = KeptAlive(name, start, **options)
        part.start()
        self.parts.append(part)

    def _start_redis(self) -> subprocess.Popen:
        # Append-only file: queued jobs and results survive a restart. The same port, password and
        # directory each time, so a Redis started again is the same Redis to every part.
        return start_redis_server(
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

    def _spawner(self, *arguments: str) -> Callable[[], subprocess.Popen]:
        """What starts ``chattts-farm ARGUMENTS`` as a part, each time it is (re)started."""
        # Sessions of their own: Ctrl-C reaches this process only, which stops the parts in order.
        return functools.partial(subprocess.Popen, [*_cli(), *arguments], env=self.environment, start_new_session=True)

    def _run_checked(self, command: list[str], what: str) -> None:
        if subprocess.run(command, env=self.environment).returncode != 0:
            raise LaunchError(f"{what} failed (see above)")

    def _announce(self) -> None:
        print(
            f"\nchattts-farm is up (model {self.plan.model}):\n"
            f"  web      http://{self.plan.host}:{self.plan.port}/\n"
            f"  flower   http://{self.plan.host}:{self.plan.flower_port}/\n"
            f"  redis    {self._shown_redis_url()}\n"
            "A part that dies is started again. Ctrl-C stops everything (workers finish their current batch).\n",
            flush=True,
        )

    def _shown_redis_url(self) -> str:
        if self.redis_password is None:
            return self.redis_url
        return f"redis://127.0.0.1:{self.plan.redis_port}/0 (password in {self.redis_directory / 'password'})"

    def _watch(self) -> int:
        while not self.stopping:
            for part in self.parts:
                part.tend()
            time.sleep(0.5)
        return 0

    def _request_stop(self, _signum, _frame) -> None:
        self.stopping = True

    def _stop_all(self) -> None:
        for part in reversed(self.parts):
            part.stop()
