"""What a worker's Celery side can carry: jobs a second, and CPU a job, with an engine that answers at once.

    python -m bench.celery_side --jobs 2000 --jobs-in-flight 512

Starts a redis-server of its own and one `chattts-farm worker --cpu 1` whose engine process is
bench.instant_engine (a result the moment a job arrives, no model): every job's cost is then the
Celery side's own (its job thread, Celery's messages and result, the audio store, encoding, a stream's
Redis writes). For each way of asking (formats, streamed or not) it sends the standard workload's
texts at once and prints a Markdown table: jobs a second, the audio seconds a wall second that would
carry, CPU milliseconds a job in the worker's Celery process and in its encoder processes, with
how many cores they kept busy, and the Redis reads (about its round trips) and commands a job (the
caller's included: the same for every version of the worker; unlike CPU time, not moved by other
load on the host).
The engine has to be at least this fast for the Celery side to be the farm's limit.

The jobs come from the same client processes as bench.standard's farm runs (how long they took to send
is in the table), and the table says how soon a burst reached the engine: from each job's send to a job
thread's taking it (the result's ``received_at``) and to its arrival at the engine, p50 and p95.
``--hold-s`` has the stand-in answer each job that long after it arrived, as a GPU's engine answers
none of a burst's jobs in its first seconds: the burst's delivery is then measured without results
flowing back beside it. ``--celery-processes`` sets the worker's
``CHATTTS_FARM_CELERY_PROCESSES`` (the GPU's way of feeding one engine from several processes).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import redis
from celery import Celery
from celery.result import AsyncResult, ResultSet

from bench.farm import bench_redis, cpu_used, percentile, running_workers, senders, worker_pids
from bench.instant_engine import HOLD_ENV
from bench.workload import standard_requests

WARM_UP_JOBS = 16
WAYS = {"wav": ("wav", False), "mp3": ("mp3", False), "ogg": ("ogg", False), "wav streamed": ("wav", True)}


def redis_work(server: redis.Redis) -> tuple[int, int]:
    """The reads and the commands the Redis server has processed so far: a round trip (one command or a
    pipeline of them) is one read, one that carries much (streamed audio) a few; a script's own calls
    are not counted."""
    stats = server.info("stats")
    return stats["total_reads_processed"], stats["total_commands_processed"]


def run_way(client: Celery, send, server: redis.Redis, pids: dict, jobs: int, audio_format: str, stream: bool) -> dict:
    requests = standard_requests(jobs, seed=len(audio_format) + stream)
    arguments = [{**request.as_arguments(), "format": audio_format, "stream": stream} for request in requests]
    before = redis_work(server)
    with cpu_used(pids) as used:
        started = time.perf_counter()
        sent = send(arguments)
        outputs = ResultSet([AsyncResult(job.task_id, app=client) for job in sent]).join_native(
            timeout=3600, propagate=True
        )
        wall = time.perf_counter() - started
    reads, commands = (now - then for now, then in zip(redis_work(server), before, strict=True))
    audio_s = sum(output["duration_s"] for output in outputs)
    # When a job thread took it (received_at), and when it arrived at the engine: the stand-in's start of
    # a job (its started_at). Epoch seconds.
    taken = [output["received_at"] - job.wall for job, output in zip(sent, outputs, strict=True)]
    reached = [output["started_at"] - job.wall for job, output in zip(sent, outputs, strict=True)]
    return {
        "redis_reads": reads / len(outputs),
        "redis_commands": commands / len(outputs),
        "jobs": len(outputs),
        "wall_s": wall,
        "sent_s": max(job.at for job in sent) - started,
        "taken_p50_s": percentile(taken, 0.5),
        "taken_p95_s": percentile(taken, 0.95),
        "reached_p50_s": percentile(reached, 0.5),
        "reached_p95_s": percentile(reached, 0.95),
        "jobs_per_s": len(outputs) / wall,
        "audio_per_wall": audio_s / wall,
        "celery_ms": 1000 * used["celery"] / len(outputs),
        "encoders_ms": 1000 * used["encoders"] / len(outputs),
        "cores": (used["celery"] + used["encoders"]) / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000, help="Jobs of each way, all sent at once.")
    parser.add_argument("--jobs-in-flight", type=int, default=512, help="Jobs the worker holds at once.")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"Which of: {', '.join(WAYS)}.")
    parser.add_argument(
        "--hold-s", type=float, default=0, help="The stand-in answers each job this long after it arrived."
    )
    parser.add_argument(
        "--celery-processes", type=int, default=0, help="The worker's Celery processes (0: its default, one)."
    )
    parser.add_argument("--redis-server", default=shutil.which("redis-server"))
    parser.add_argument("--workdir", default="var/bench")
    arguments = parser.parse_args()
    ways = [way.strip() for way in arguments.ways.split(",") if way.strip()]
    workdir = Path(arguments.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    rows = []
    with bench_redis(workdir, arguments.redis_server) as redis_url:
        client = Celery(broker=redis_url, backend=redis_url)
        server = redis.Redis.from_url(redis_url)
        settings = {
            "CHATTTS_FARM_REDIS_URL": redis_url,
            "CHATTTS_FARM_ENGINE_MODULE": "bench.instant_engine",
            "CHATTTS_FARM_MAX_JOBS_IN_FLIGHT": str(arguments.jobs_in_flight),
            "CHATTTS_FARM_CELERY_PROCESSES": str(arguments.celery_processes),
            HOLD_ENV: str(arguments.hold_s),
        }
        with (
            running_workers(client, ["--cpu", "1"], settings, workdir / "celery-side-worker.log") as supervisor,
            senders(redis_url) as send,
        ):
            pids = worker_pids(client, ["cpu0"], supervisor)
            del pids["engine"]  # the stand-in's own cost is not the farm's
            # A few jobs (connections, Redis's scripts, imports): each way's burst then comes as a fresh
            # worker's first does, as bench.standard's farm runs send theirs.
            run_way(client, send, server, pids, min(arguments.jobs, WARM_UP_JOBS), "wav", False)
            for way in ways:
                rows.append((way, run_way(client, send, server, pids, arguments.jobs, *WAYS[way])))
                print(f"{way}: {rows[-1][1]['jobs_per_s']:.1f} jobs/s", flush=True)

    answering = f"{arguments.hold_s:g} s after each job arrived" if arguments.hold_s else "at once"
    print(
        f"\none worker's Celery side ({arguments.celery_processes or 1} Celery process(es)), its engine answering "
        f"{answering}; {arguments.jobs} jobs of the standard workload a way, sent at once, "
        f"{arguments.jobs_in_flight} held at a time\n"
    )
    print(
        "| way | jobs | wall s | jobs/s | audio-s/s carried | sent in s | a job thread took it p50 / p95 s "
        "| reached the engine p50 / p95 s "
        "| Celery process CPU ms a job | encoders' CPU ms a job | cores busy | Redis reads a job "
        "| Redis commands a job |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for way, row in rows:
        print(
            f"| {way} | {row['jobs']} | {row['wall_s']:.2f} | {row['jobs_per_s']:.1f} | {row['audio_per_wall']:.0f} "
            f"| {row['sent_s']:.2f} | {row['taken_p50_s']:.2f} / {row['taken_p95_s']:.2f} "
            f"| {row['reached_p50_s']:.2f} / {row['reached_p95_s']:.2f} "
            f"| {row['celery_ms']:.1f} | {row['encoders_ms']:.1f} | {row['cores']:.2f} "
            f"| {row['redis_reads']:.1f} | {row['redis_commands']:.1f} |"
        )


if __name__ == "__main__":
    main()
