"""End-to-end throughput of the farm: jobs through Redis and Celery workers, batching on vs off.

    python bench/farm.py --model synthetic-tiny --cpu 1 --jobs 48 --jobs-in-flight 16
    python bench/farm.py --model synthetic-full --gpus 0 --jobs 256 --jobs-in-flight 128

Starts its own redis-server (from PATH, or --redis-server) and `chattts-farm worker` twice: once with
batching (--jobs-in-flight jobs held, --slots engine slots) and once with MAX_JOBS_IN_FLIGHT=1 and
SLOTS=1 (one job at a time). Submits all jobs at once, waits for every result, and prints a
Markdown table of jobs per second and audio seconds per wall second.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import redis
from celery import Celery

from chattts_farm.celery_client import create_celery
from chattts_farm.contract import TASK_NAME
from chattts_farm.settings import Settings
from cli.local_services import free_port, start_redis_server
from worker.supervisor import plan_workers

TEXT = "The farm keeps every GPU busy by batching the jobs that wait. Nothing is lost."
WORKERS_START_TIMEOUT_S = 600
# Client processes that send a timed run's jobs. One Celery client sends ~1,000 jobs a second (1.0 ms a
# send_task on the 2-core development machine: the job's message, its task-sent event, a Redis client
# each), so that one sent the standard workload's 1,536 jobs over ~1.5 s while the engine alone has all of
# them at once; a farm's jobs come from many clients.
SENDER_PROCESSES = 8


class Sent(NamedTuple):
    """A job a sender process sent, and when: ``time.perf_counter`` (the host's monotonic clock, one for
    every process on Linux) and epoch seconds (the clock the farm's results tell their times by)."""

    task_id: str
    at: float
    wall: float


# The Celery client of a sender process (see ``senders``).
_sender_client: Celery | None = None


@contextmanager
def senders(redis_url: str, processes: int = SENDER_PROCESSES) -> Iterator[Callable[[list[dict]], list[Sent]]]:
    """``send(jobs)``: the jobs' keyword arguments sent as the farm's task from ``processes`` client processes
    at once (the i-th of every ``processes`` jobs by the i-th), returning each job's :class:`Sent`, in order."""
    # Not forked: the bench's process may hold a CUDA context.
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_open_sender, initargs=(redis_url,)) as pool:

        def send(jobs: list[dict]) -> list[Sent]:
            shares = list(pool.map(_send_share, [jobs[start::processes] for start in range(processes)]))
            sent: list[Sent] = [None] * len(jobs)
            for start, share in enumerate(shares):
                sent[start::processes] = share
            return sent

        yield send


def _open_sender(redis_url: str) -> None:
    global _sender_client
    _sender_client = create_celery(Settings.from_env(redis_url=redis_url))


def _send_share(jobs: list[dict]) -> list[Sent]:
    sent = []
    for kwargs in jobs:
        task_id = _sender_client.send_task(TASK_NAME, kwargs=kwargs).id
        sent.append(Sent(task_id, time.perf_counter(), time.time()))
    return sent


def percentile(values: list[float], fraction: float) -> float | None:
    """Linear interpolation between the closest ranks; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used so far, every thread, user and system (Linux: from /proc)."""
    # The fields after the command's closing parenthesis start at the state (field 3 of proc(5)).
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def minor_page_faults(pid: int) -> int:
    """Minor page faults a process has taken so far, every thread (Linux: from /proc): each the kernel
    mapping it a page of memory it touched for the first time since it was allocated."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[7])


class ProcessUsage:
    """CPU seconds and minor page faults of each kind of a worker's processes (see :func:`worker_pids`),
    interval by interval."""

    def __init__(self, pids: dict[str, Callable[[], list[int]]]):
        self.pids = pids
        self._last = self._read()

    def _read(self) -> dict[str, dict[int, tuple[float, int]]]:
        return {
            kind: {pid: (cpu_seconds(pid), minor_page_faults(pid)) for pid in kind_pids()}
            for kind, kind_pids in self.pids.items()
        }

    def since_last(self) -> dict[str, tuple[float, int]]:
        """Per kind: the CPU seconds and page faults its processes took since the last call (or the start;
        a process started since counts whole)."""
        now = self._read()
        spent = {}
        for kind, figures in now.items():
            before = self._last.get(kind, {})
            spent[kind] = (
                sum(cpu - before.get(pid, (0.0, 0))[0] for pid, (cpu, _) in figures.items()),
                sum(faults - before.get(pid, (0.0, 0))[1] for pid, (_, faults) in figures.items()),
            )
        self._last = now
        return spent


def worker_pids(client: Celery, queues: list[str], supervisor_pid: int) -> dict[str, Callable[[], list[int]]]:
    """The processes of the workers behind ``queues`` (gpu0, cpu0), by kind: their Celery processes
    (every child of their supervisor), their engine processes, and the encoder processes their Celery
    processes start as needed."""
    engines = [client.send_task("chattts.health", queue=queue).get(timeout=60)["engine_pid"] for queue in queues]
    celery = children(supervisor_pid)
    return {
        "celery": lambda: celery,
        "engine": lambda: engines,
        "encoders": lambda: [child for pid in celery for child in children(pid) if child not in engines],
    }


def children(pid: int) -> list[int]:
    """A process's children (Linux: from /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.extend(int(child) for child in (task / "children").read_text().split())
    return found


@contextmanager
def cpu_used(pids: dict[str, Callable[[], list[int]]]) -> Iterator[dict[str, float]]:
    """CPU seconds each kind of process used inside the block (a process started inside it counts
    whole), filled in as the block ends."""
    usage = ProcessUsage(pids)
    used: dict[str, float] = {}
    yield used
    used.update({kind: cpu for kind, (cpu, _) in usage.since_last().items()})


def redis_server_pid(redis_url: str) -> int:
    """The process id of the redis-server behind ``redis_url`` (it must be on this host to be read from /proc)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


@contextmanager
def bench_redis(workdir: Path, server: str | None) -> Iterator[str]:
    """A redis-server of its own without persistence, in ``workdir``: its URL; stopped on exit."""
    port = free_port()
    process = start_redis_server(port, workdir, "--save", "", "--appendonly", "no", server=server)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextmanager
def running_workers(client: Celery, placement: list[str], settings: dict[str, str], log: Path) -> Iterator[int]:
    """`chattts-farm worker PLACEMENT` (``--cpu N`` or ``--gpus 0,1``) with ``settings`` (CHATTTS_FARM_*
    variables) added to the environment, logging to ``log``, once every Celery process answers
    ``client``'s ping: the supervisor's pid; stopped on exit, warm (each worker finishes its batch)."""
    environment = {**os.environ, **settings}
    cpu, gpus = (int(placement[1]), None) if placement[0] == "--cpu" else (None, placement[1])
    celery_processes = Settings.from_env(environment).celery_processes
    # How many Celery processes the supervisor will start (the sockets' directory is its own: any will do here).
    processes = len(plan_workers(gpus, cpu, celery_processes=celery_processes, socket_dir=str(log.parent)))
    with log.open("w") as handle:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "cli", "worker", *placement],
            env=environment,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + WORKERS_START_TIMEOUT_S
        while len(client.control.ping(timeout=1.0)) < processes:
            if supervisor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"workers did not start; see {log}")
        yield supervisor.pid
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=300)


def run_farm(arguments, redis_url: str, jobs: int, max_jobs_in_flight: int, slots: int, log: Path) -> dict:
    settings = {
        "CHATTTS_FARM_REDIS_URL": redis_url,
        "CHATTTS_FARM_MODEL": arguments.model,
        "CHATTTS_FARM_MAX_JOBS_IN_FLIGHT": str(max_jobs_in_flight),
        "CHATTTS_FARM_SLOTS": str(slots),
    }
    placement = ["--cpu", str(arguments.cpu)] if arguments.cpu else ["--gpus", arguments.gpus]
    client = Celery(broker=redis_url, backend=redis_url)
    with running_workers(client, placement, settings, log):
        # Warm-up: one batch's worth, so the measured run meets warm kernels.
        for result in [
            client.send_task(TASK_NAME, kwargs={"text": TEXT, "voice": i}) for i in range(max_jobs_in_flight)
        ]:
            result.get(timeout=1800)
        started = time.perf_counter()
        results = [
            client.send_task(TASK_NAME, kwargs={"text": TEXT, "voice": 1000 + i, "seed": i}) for i in range(jobs)
        ]
        outputs = [result.get(timeout=3600) for result in results]
        wall = time.perf_counter() - started
    audio = sum(output["duration_s"] for output in outputs)
    return {
        "max_jobs_in_flight": max_jobs_in_flight,
        "slots": slots,
        "jobs": len(outputs),
        "wall_s": wall,
        "jobs_per_s": len(outputs) / wall,
        "audio_per_wall": audio / wall,
        "mean_batch": sum(o["batch_size"] for o in outputs) / len(outputs),
        "largest_batch": max(o["batch_size"] for o in outputs),
        "model": outputs[0]["model_info"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic-tiny")
    parser.add_argument("--cpu", type=int, default=0, help="CPU workers (default: GPU workers).")
    parser.add_argument("--gpus", default="0")
    parser.add_argument("--jobs", type=int, default=48)
    parser.add_argument(
        "--unbatched-jobs",
        type=int,
        default=None,
        help="Jobs for the run without batching (default: --jobs); it is the slow one.",
    )
    parser.add_argument("--jobs-in-flight", type=int, default=16)
    parser.add_argument("--slots", type=int, default=64, help="Engine slots when batching.")
    parser.add_argument("--redis-server", default=shutil.which("redis-server"))
    parser.add_argument("--workdir", default="var/bench")
    arguments = parser.parse_args()

    workdir = Path(arguments.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with bench_redis(workdir, arguments.redis_server) as redis_url:
        rows = [
            run_farm(
                arguments,
                redis_url,
                arguments.jobs,
                arguments.jobs_in_flight,
                arguments.slots,
                workdir / "batched.log",
            ),
            run_farm(arguments, redis_url, arguments.unbatched_jobs or arguments.jobs, 1, 1, workdir / "unbatched.log"),
        ]
    model = rows[0]["model"]
    print(
        f"\nmodel {model['source']} on {model['device']} ({model['dtype']}), "
        f"{arguments.cpu or len(arguments.gpus.split(','))} worker(s), all jobs of a run submitted at once\n"
    )
    columns = (
        "mode",
        "jobs in flight",
        "slots",
        "jobs",
        "wall s",
        "jobs/s",
        "audio-s per wall-s",
        "mean batch",
        "largest batch",
    )
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row, mode in zip(rows, ("batching on", "batching off"), strict=True):
        cells = (
            mode,
            row["max_jobs_in_flight"],
            row["slots"],
            row["jobs"],
            f"{row['wall_s']:.2f}",
            f"{row['jobs_per_s']:.2f}",
            f"{row['audio_per_wall']:.1f}",
            f"{row['mean_batch']:.1f}",
            row["largest_batch"],
        )
        print("| " + " | ".join(str(cell) for cell in cells) + " |")


if __name__ == "__main__":
    main()
