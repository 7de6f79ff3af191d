"""Load test: N clients submit jobs and poll them against a farm started by `chattts-farm up`.

    python bench/load.py --clients 50 --seconds 120

    python bench/load.py --clients 50 --seconds 120 --database postgresql

Starts `chattts-farm up --model synthetic-tiny` on free loopback ports in a temporary data dir (or
uses --url), its audio in the default file store (the data dir's ``audio``) and its database SQLite
or, with ``--database postgresql``, a throwaway PostgreSQL server started here (Debian's package);
runs the clients for the given time, waits for every accepted job, and prints requests per second,
API latency percentiles, job completion latency, failed requests, lost jobs (accepted but never done
or failed), Redis's memory at the end of the run (`INFO memory`: used and peak; with --url, give the
farm's Redis with --redis-url, default CHATTTS_FARM_REDIS_URL) and the audio store's size on disk.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
import requests

from chattts_farm.settings import Settings
from cli.launcher import redis_password
from cli.local_services import free_port, start_postgres_server

TEXTS = ("Load test sentence number {i}.", "The farm must not lose job {i}.", "Client {c} asks for audio {i}.")
POLL_S = 0.5
MIB = 2**20


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)  # every API request, seconds
    completions: list[float] = field(default_factory=list)  # submit to done, seconds
    failed_requests: int = 0
    failed_jobs: int = 0
    accepted: list[str] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def timed(tally: Tally, call, *args, **kwargs):
    started = time.perf_counter()
    try:
        response = call(*args, timeout=30, **kwargs)
    except requests.RequestException:
        response = None
    elapsed = time.perf_counter() - started
    with tally.lock:
        tally.latencies.append(elapsed)
        if response is None or response.status_code >= 400:
            tally.failed_requests += 1
    return response


def client(base: str, number: int, stop_at: float, tally: Tally) -> None:
    session = requests.Session()
    i = 0
    while time.monotonic() < stop_at:
        submitted = time.monotonic()
        answer = timed(
            tally,
            session.post,
            base + "/api/jobs",
            json={"text": TEXTS[i % len(TEXTS)].format(i=i, c=number), "voice": number},
        )
        i += 1
        if answer is None or answer.status_code != 202:
            continue
        job = answer.json()
        with tally.lock:
            tally.accepted.append(job["id"])
        follow(session, base, job, submitted, tally, deadline=time.monotonic() + 600)


def follow(session, base, job, submitted, tally, deadline) -> None:
    while time.monotonic() < deadline:
        status = timed(tally, session.get, base + job["status_url"])
        if status is not None and status.status_code == 200:
            state = status.json()["status"]
            if state == "done":
                with tally.lock:
                    tally.done.add(job["id"])
                    tally.completions.append(time.monotonic() - submitted)
                return
            if state in ("failed", "cancelled"):
                with tally.lock:
                    tally.failed_jobs += 1
                return
        time.sleep(POLL_S)


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(share * 100) - 1] if len(values) > 1 else values[0]
    )


def redis_memory_mib(redis_url: str) -> tuple[float, float]:
    """Redis's memory now and at its peak, MiB (``INFO memory``: used_memory, used_memory_peak)."""
    memory = redis.Redis.from_url(redis_url).info("memory")
    return memory["used_memory"] / MIB, memory["used_memory_peak"] / MIB


def store_size_mib(directory: Path) -> float:
    """The bytes of every file under a file store's directory, MiB."""
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file()) / MIB


def start_farm(workdir: Path, database_url: str | None) -> tuple[subprocess.Popen, str, str]:
    """`chattts-farm up` in ``workdir`` (on ``database_url``, else SQLite there): the process, its web
    address and its Redis URL."""
    port, flower, redis_port = free_port(), free_port(), free_port()
    # The password `up` gives the Redis it starts, made here first: the same file, so the same password.
    redis_url = f"redis://:{redis_password(workdir / 'redis')}@127.0.0.1:{redis_port}/0"
    environment = {**os.environ}
    for inherited in ("CHATTTS_FARM_REDIS_URL", "CHATTTS_FARM_AUDIO_STORE", "CHATTTS_FARM_DATABASE_URL"):
        environment.pop(inherited, None)
    if database_url:
        environment["CHATTTS_FARM_DATABASE_URL"] = database_url
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "up",
            "--model",
            "synthetic-tiny",
            "--port",
            str(port),
            "--flower-port",
            str(flower),
            "--redis-port",
            str(redis_port),
            "--data-dir",
            str(workdir),
            "--cpu-workers",
            "1",
        ],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if requests.get(base + "/readyz", timeout=2).json().get("ready"):
                return process, base, redis_url
        except (requests.RequestException, ValueError):
            pass
        time.sleep(1)
    process.send_signal(signal.SIGTERM)
    raise RuntimeError("the farm did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--url", help="A running farm's web address (default: start one with up).")
    parser.add_argument("--redis-url", help="With --url: that farm's Redis (default: CHATTTS_FARM_REDIS_URL).")
    parser.add_argument(
        "--database",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="The started farm's database: SQLite in its data dir, or a throwaway PostgreSQL server.",
    )
    arguments = parser.parse_args()

    farm = postgres = None
    store_mib = float("nan")
    with tempfile.TemporaryDirectory(prefix="chattts-load-") as workdir:
        if arguments.url:
            base = arguments.url.rstrip("/")
            redis_url = arguments.redis_url or Settings.from_env().redis_url
        else:
            if arguments.database == "postgresql":
                postgres = start_postgres_server(free_port())
            farm, base, redis_url = start_farm(Path(workdir), postgres.create_database() if postgres else None)
        tally = Tally()
        started = time.monotonic()
        stop_at = started + arguments.seconds
        threads = [threading.Thread(target=client, args=(base, n, stop_at, tally)) for n in range(arguments.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.monotonic() - started
        redis_used_mib, redis_peak_mib = redis_memory_mib(redis_url)
        if farm is not None:
            store_mib = store_size_mib(Path(workdir) / "audio")
            farm.send_signal(signal.SIGTERM)
            farm.wait(timeout=300)
        if postgres is not None:
            postgres.stop()

    lost = len(tally.accepted) - len(tally.done) - tally.failed_jobs
    database = "given" if arguments.url else arguments.database
    print(
        f"\n{arguments.clients} clients for {arguments.seconds:.0f} s against {base} (wall {wall:.0f} s; "
        f"database {database}, audio in the file store)\n"
    )
    print(
        "| requests | requests/s | API p50 ms | API p95 ms | API p99 ms | jobs accepted | jobs done "
        "| job p50 s | job p95 s | failed requests | failed jobs | lost jobs | Redis used MiB | Redis peak MiB "
        "| audio store MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {len(tally.latencies)} | {len(tally.latencies) / wall:.1f} | "
        f"{1000 * percentile(tally.latencies, 0.50):.0f} | {1000 * percentile(tally.latencies, 0.95):.0f} | "
        f"{1000 * percentile(tally.latencies, 0.99):.0f} | {len(tally.accepted)} | {len(tally.done)} | "
        f"{percentile(tally.completions, 0.50):.2f} | {percentile(tally.completions, 0.95):.2f} | "
        f"{tally.failed_requests} | {tally.failed_jobs} | {lost} | {redis_used_mib:.1f} | {redis_peak_mib:.1f} "
        f"| {store_mib:.1f} |"
    )
    sys.exit(0 if tally.failed_requests == 0 and lost == 0 else 1)


if __name__ == "__main__":
    main()
