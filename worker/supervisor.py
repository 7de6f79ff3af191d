"""``chattts-farm worker``: one Celery worker process per GPU (or N CPU workers), kept alive.

The supervisor never imports torch or initialises CUDA (GPUs are counted with nvidia-smi), so every
child gets a clean process pinned to its GPU with ``CUDA_VISIBLE_DEVICES``. A child that dies is
started again after a backoff; SIGTERM or SIGINT asks every child for a warm shutdown (it finishes
its current batch) and waits for them.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from chattts_farm.contract import CELERY_DEFAULT_QUEUE, DEFAULT_QUEUE, worker_queue
from chattts_farm.kept_alive import KeptAlive, sigterm_when_this_process_dies
from chattts_farm.settings import Settings
from worker.cuda import configure_allocator

logger = logging.getLogger(__name__)


class NoGpus(RuntimeError):
    """No GPU could be found for ``--gpus all``."""


def list_gpus() -> list[int]:
    """GPU indices from nvidia-smi; NVML through nvidia-smi keeps CUDA out of this process."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return []
    try:
        listing = subprocess.run(
            [nvidia_smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [int(line) for line in listing.split() if line.strip().isdigit()]


@dataclass
class WorkerSpec:
    kind: str  # "gpu" | "cpu"
    index: int

    @property
    def name(self) -> str:
        return worker_queue(self.kind, self.index)

    def command(self, settings: Settings, loglevel: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.celery_app",
            "worker",
            # One process, one model: the threads pool gives each held job a thread that waits for
            # the process's batcher, so `max_jobs_in_flight` threads are the batching window.
            "--pool",
            "threads",
            "--concurrency",
            str(settings.max_jobs_in_flight),
            # Celery's own default queue too: a plain client's send_task without routing lands there.
            "--hostname",
            f"{self.name}@{settings.node_name or '%h'}",
            "--queues",
            f"{DEFAULT_QUEUE},{CELERY_DEFAULT_QUEUE},{self.name}",
            "--prefetch-multiplier",
            "1",
            "--task-events",
            "--loglevel",
            loglevel,
        ]

    def environment(self) -> dict[str, str]:
        environment = dict(os.environ)
        if self.kind == "gpu":
            environment["CUDA_VISIBLE_DEVICES"] = str(self.index)
            environment.setdefault("CHATTTS_FARM_DEVICE", "cuda")
        else:
            environment["CUDA_VISIBLE_DEVICES"] = ""
            environment["CHATTTS_FARM_DEVICE"] = "cpu"
        configure_allocator(environment)
        return environment


def plan_workers(gpus: str | None, cpu: int | None) -> list[WorkerSpec]:
    if cpu:
        return [WorkerSpec("cpu", i) for i in range(cpu)]
    if gpus in (None, "all"):
        indices = list_gpus()
        if not indices:
            raise NoGpus("no GPU found (nvidia-smi lists none): use --cpu N to run CPU workers")
    else:
        indices = [int(part) for part in gpus.split(",") if part.strip()]
    return [WorkerSpec("gpu", i) for i in indices]


class Supervisor:
    def __init__(self, specs: list[WorkerSpec], settings: Settings, loglevel: str = "INFO"):
        self.children = [KeptAlive(f"worker {spec.name}", functools.partial(self._spawn, spec)) for spec in specs]
        self.settings = settings
        self.loglevel = loglevel
        self.stopping = False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        for child in self.children:
            child.start()
        while not self.stopping:
            for child in self.children:
                child.tend()
            time.sleep(0.5)
        return self._shut_down()

    def _spawn(self, spec: WorkerSpec) -> subprocess.Popen:
        # A session of its own: a terminal's Ctrl-C reaches the supervisor only, which then asks each
        # child once for a warm shutdown (a second signal would make Celery cut the batch short). A
        # supervisor killed outright takes its workers with it (after their batch), so the one started
        # in its place runs the only workers of these names.
        return subprocess.Popen(
            spec.command(self.settings, self.loglevel),
            env=spec.environment(),
            start_new_session=True,
            preexec_fn=sigterm_when_this_process_dies(),
        )

    def _request_stop(self, signum, _frame) -> None:
        if self.stopping:
            return
        logger.info("received %s: stopping workers after their current batch", signal.Signals(signum).name)
        self.stopping = True

    def _shut_down(self) -> int:
        for child in self.children:
            child.signal_stop()  # Celery's warm shutdown
        for child in self.children:
            child.wait()
        logger.info("all workers stopped")
        return 0
