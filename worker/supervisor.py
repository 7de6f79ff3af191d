"""``chattts-farm worker``: Celery worker processes for each GPU (or N CPU workers), kept alive.

The supervisor never imports torch or initialises CUDA (GPUs are counted with nvidia-smi), so every
child gets a clean process pinned to its GPU with ``CUDA_VISIBLE_DEVICES``. A GPU has
``CHATTTS_FARM_CELERY_PROCESSES`` of them (three by default): the first starts the GPU's engine process,
the others connect to it. A child that dies is started again after a backoff; SIGTERM or SIGINT asks
every child for a warm shutdown (it finishes its current batch) and waits for them, each engine's
other Celery processes before the one whose engine it is.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from chattts_farm.callbacks import CALLBACK_QUEUE
from chattts_farm.contract import JOB_QUEUES, worker_queue
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
    process: int = 0  # which of its engine's Celery processes: the first (0) starts the engine
    processes: int = 1  # how many Celery processes its engine has
    engine_socket: str = ""  # where the engine listens for the others, when there are several

    @property
    def queue(self) -> str:
        return worker_queue(self.kind, self.index)

    @property
    def name(self) -> str:
        """``gpu0``, and ``gpu0.1``, ``gpu0.2``... for the GPU's other Celery processes."""
        return self.queue if self.process == 0 else f"{self.queue}.{self.process}"

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
            str(math.ceil(self.jobs_in_flight(settings) / self.processes)),
            "--hostname",
            f"{self.name}@{settings.node_name or '%h'}",
            # Read in this order (see chattts_farm.celery_client): the callbacks' deliveries (they wait
            # between attempts in Redis, holding no thread, and are quick) and the jobs pinned to this
            # worker first, then the jobs by priority, Celery's own default queue (a plain client's
            # send_task without routing lands there) with the normal ones.
            "--queues",
            ",".join((CALLBACK_QUEUE, self.queue, *JOB_QUEUES)),
            "--prefetch-multiplier",
            "1",
            "--task-events",
            "--loglevel",
            loglevel,
        ]

    def jobs_in_flight(self, settings: Settings) -> int:
        """The jobs its GPU's (or CPU worker's) Celery processes hold at once, all together."""
        return settings.jobs_in_flight(on_gpu=self.kind == "gpu")

    def environment(self, settings: Settings) -> dict[str, str]:
        environment = dict(os.environ)
        # Resolved here, for the Celery processes to size their thread pools and Redis pools by.
        environment["CHATTTS_FARM_MAX_JOBS_IN_FLIGHT"] = str(self.jobs_in_flight(settings))
        if self.kind == "gpu":
            environment["CUDA_VISIBLE_DEVICES"] = str(self.index)
            environment.setdefault("CHATTTS_FARM_DEVICE", "cuda")
        else:
            environment["CUDA_VISIBLE_DEVICES"] = ""
            environment["CHATTTS_FARM_DEVICE"] = "cpu"
        environment["CHATTTS_FARM_ENGINE_SOCKET"] = self.engine_socket
        environment["CHATTTS_FARM_ENGINE_STARTER"] = "true" if self.process == 0 else "false"
        configure_allocator(environment)
        return environment


def plan_workers(
    gpus: str | None, cpu: int | None, *, celery_processes: int = 0, socket_dir: str = ""
) -> list[WorkerSpec]:
    """The Celery processes to run: ``celery_processes`` for each GPU or CPU worker (0: three for a GPU,
    one for a CPU worker), the engine of each with several listening in ``socket_dir``."""
    if cpu:
        kind, indices = "cpu", list(range(cpu))
    elif gpus in (None, "all"):
        kind, indices = "gpu", list_gpus()
        if not indices:
            raise NoGpus("no GPU found (nvidia-smi lists none): use --cpu N to run CPU workers")
    else:
        kind, indices = "gpu", [int(part) for part in gpus.split(",") if part.strip()]
    processes = celery_processes or (3 if kind == "gpu" else 1)
    if processes > 1 and not socket_dir:
        raise ValueError("several Celery processes for an engine need a directory for its socket")
    specs = []
    for index in indices:
        socket = f"{socket_dir}/{worker_queue(kind, index)}.sock" if processes > 1 else ""
        specs += [WorkerSpec(kind, index, process, processes, socket) for process in range(processes)]
    return specs


class Supervisor:
    def __init__(self, specs: list[WorkerSpec], settings: Settings, loglevel: str = "INFO"):
        self.specs = specs
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
            env=spec.environment(self.settings),
            start_new_session=True,
            preexec_fn=sigterm_when_this_process_dies(),
        )

    def _request_stop(self, signum, _frame) -> None:
        if self.stopping:
            return
        logger.info("received %s: stopping workers after their current batch", signal.Signals(signum).name)
        self.stopping = True

    def _shut_down(self) -> int:
        # Each engine's other Celery processes finish first: the engine ends with the one that started it.
        starters = [spec.process == 0 for spec in self.specs]
        for stopping_starters in (False, True):
            group = [
                child for child, starter in zip(self.children, starters, strict=True) if starter == stopping_starters
            ]
            for child in group:
                child.signal_stop()  # Celery's warm shutdown
            for child in group:
                child.wait()
        logger.info("all workers stopped")
        return 0
