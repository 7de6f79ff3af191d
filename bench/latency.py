"""First-chunk latency of streaming jobs, at several numbers of clients at once.

    python -m bench.latency --model synthetic-full --gpus 0 --clients 1,8,64,256 --engine --web
    python -m bench.latency --model synthetic-tiny --cpu 1 --clients 1,4 --seconds 2

Starts its own redis-server and `chattts-farm worker`, then for each number of clients submits that
many streaming jobs at once (each a text of --seconds of speech, voices mixed) and reads each job's
stream with ``chattts_farm.streams.stream_audio`` on a thread of its own (the threads shared among a
few reader processes), as a plain Celery + Redis caller does (``farm`` rows). With --engine the same
levels first run through the synthesizer in this process (``engine`` rows: no transport); with --web
they run last through `chattts-farm web` (``web`` rows: POST /api/jobs with ``stream``, then GET
/api/jobs/<id>/stream, read as the farm's are). Per level it prints first-chunk latency from submit
(p50 / p95 / p99), underruns (a chunk arriving after the audio delivered before it would have finished
playing, playback starting at the first chunk), the chunks a stream came in, and the audio-s per wall-s
of the level, and that as a share of the farm's unstreamed throughput (the last level's clients, not
streamed, run last: a worker warm from the levels before; with --plain-first they also run first,
before the streamed levels, and that level's throughput too is given as a share of the last); for the
``farm`` and ``web`` rows also where the first chunks waited: until the engine started the job, until its first
audio reached the worker's Celery process (both from each job's result), until Redis appended it to
the job's stream (``farm`` rows: from the entry's id, Redis's clock), and from there to the client.
Last, level by level, the workers' engine threads: seconds in steps, of which waiting for the device,
and the rest, the host's own work (from the workers' health, read a second after each level); and the
CPU seconds and minor page faults of the workers' Celery processes and engine processes, and of
Redis (which grows its memory for a first level's streams and results as the processes do theirs).
With --py-spy DIR, py-spy samples the engine processes over each level (native stacks, into DIR) and
it prints where each of their threads was: running Python, in native code, in the CUDA driver, waiting
for the interpreter's lock (bench.py_spy).

With --in-turn N, after the other levels, N rounds at the last level's clients of an unstreamed level
and then a streamed one (the closing unstreamed level ends the last round): each streamed level is set
against the mean of the unstreamed levels on either side of it, and the median share over the rounds
is printed. One level is one wave of jobs (1.5-2 s at 256 clients on an H200, where one tree's
unstreamed level gave 1,461 and 1,978 audio-s/s in one run): alone it cannot judge a share within a
few points."""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from bench import py_spy
from bench.farm import ProcessUsage, bench_redis, redis_server_pid, running_workers, worker_pids
from bench.workload import standard_requests
from chattts_farm.celery_client import create_celery
from chattts_farm.contract import TASK_NAME, queue_of_worker
from chattts_farm.settings import Settings
from chattts_farm.streams import stream_audio
from cli.local_services import free_port
from worker.audio import SAMPLE_RATE

WORKLOAD_SEED = 7
WEB_START_TIMEOUT_S = 120
# How long a web client waits, after its stream ended, for the job's result (for the hops of its first chunk).
RESULT_WAIT_S = 30
BYTES_PER_SAMPLE = 2
# Processes that read a level's streams, each on a thread a job.
READER_PROCESSES = 8
READER_START_TIMEOUT_S = 60
STREAM_TIMEOUT_S = 600
# Longer than a stream's own timeout: a reader process that died is an error, not a hang.
READ_TIMEOUT_S = STREAM_TIMEOUT_S + 60
# An engine reports its figures to its worker every half second: after a level, they are read this much later.
ENGINE_REPORT_SETTLE_S = 1.0


@dataclass
class Listener:
    """One client: when it submitted, and when each chunk came with how much audio it carried."""

    submitted: float
    arrivals: list[tuple[float, float]] = field(default_factory=list)  # (perf_counter, audio seconds)
    error: str | None = None
    submitted_wall: float = field(default_factory=time.time)
    # Through the farm or the web, where its first chunk's wait went (seconds): from submit to the engine's start
    # of the job, from there to the engine process's sending its first audio, from there to the worker's Celery
    # process, from there to its append to the job's Redis stream (from the entry's id; None through the web),
    # and from there (or the worker) to this client.
    hops: tuple[float, float | None, float | None, float | None, float] | None = None

    def heard(self, pcm_bytes: int) -> None:
        """A chunk of 16-bit samples arrived now."""
        self.arrivals.append((time.perf_counter(), pcm_bytes / BYTES_PER_SAMPLE / SAMPLE_RATE))

    @property
    def first_chunk_s(self) -> float | None:
        return self.arrivals[0][0] - self.submitted if self.arrivals else None

    def note_hops(
        self,
        engine_started: float | None,
        first_audio_in_worker: float | None,
        sent_by_engine: float | None = None,
        appended: float | None = None,
    ) -> None:
        """Split the first chunk's wait at the hops the job's result timed: when the engine started it
        (epoch seconds), when its first audio reached the worker (seconds after that) and, where the result
        says, when the engine process sent it (seconds after the start); and, where the client read the
        first chunk's stream entry itself, when Redis appended it (epoch seconds)."""
        if self.first_chunk_s is None or engine_started is None or first_audio_in_worker is None:
            return
        to_engine = engine_started - self.submitted_wall
        in_worker = engine_started + first_audio_in_worker
        to_worker = None if sent_by_engine is None else first_audio_in_worker - sent_by_engine
        to_redis = None if appended is None else appended - in_worker
        to_client = self.first_chunk_s - to_engine - first_audio_in_worker - (to_redis or 0.0)
        self.hops = (to_engine, sent_by_engine, to_worker, to_redis, to_client)

    @property
    def underruns(self) -> int:
        """Chunks that came after everything delivered before them had played (from the first chunk on)."""
        count, played_until = 0, None
        for at, seconds in self.arrivals:
            if played_until is None:
                played_until = at
            elif at > played_until:
                count += 1
                played_until = at
            played_until += seconds
        return count

    @property
    def audio_s(self) -> float:
        return sum(seconds for _, seconds in self.arrivals)


def run_level(path: str, clients: int, seconds: float, submit, listen) -> dict:
    """A level: each client's job sent with ``submit(request) -> handle``, then read on a thread of its own
    with ``listen(handle, listener)`` (a function this module's processes can import) in one of up to
    READER_PROCESSES reader processes, started and ready before the first job is sent.

    Readers in processes, not all in this one: on the H200 host (twelfth session) Redis appended the
    256-stream level's first chunks within 3 ms of the worker's having them (p95), and 256 reader
    threads sharing one interpreter read them 235 ms later. ``time.perf_counter`` is the host's
    monotonic clock on Linux, one for every process, so a reader's arrival times and this process's
    submit times are on one clock."""
    # A fork server imports this module (and the torch behind bench.workload, ~6 s on the CPU machine)
    # once, and forks the readers from it; spawned, every reader process imported it, each level.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["bench.latency"])
    outbox = context.Queue()
    inboxes = [context.Queue() for _ in range(min(READER_PROCESSES, clients))]
    # Daemons: a level that fails before its readers are handed their end leaves none behind to wait on.
    readers = [context.Process(target=read_streams, args=(listen, inbox, outbox), daemon=True) for inbox in inboxes]
    for reader in readers:
        reader.start()
    for _ in readers:
        outbox.get(timeout=READER_START_TIMEOUT_S)
    # Made before the clock starts: the level's 256 texts took ~0.12 s to make (H200 host, py-spy), and
    # its wall is what its audio-s per wall-s divides by.
    requests = level_requests(clients, seconds)
    started = time.perf_counter()
    try:
        for number, request in enumerate(requests):
            submitted, submitted_wall = time.perf_counter(), time.time()
            handle = submit({**request.as_arguments(), "stream": True})
            inboxes[number % len(inboxes)].put((submitted, submitted_wall, handle))
        for inbox in inboxes:
            inbox.put(None)
        listeners = [listener for _ in readers for listener in outbox.get(timeout=READ_TIMEOUT_S)]
    finally:
        for reader in readers:
            reader.join(timeout=30)
    return level_row(path, clients, listeners, time.perf_counter() - started)


def read_streams(listen, inbox, outbox) -> None:
    """A reader process: says it is ready, then reads each job it is handed on a thread of its own until
    it is handed None, and sends back the jobs' listeners."""
    outbox.put("ready")
    listeners, threads = [], []
    while (job := inbox.get()) is not None:
        submitted, submitted_wall, handle = job
        listener = Listener(submitted, submitted_wall=submitted_wall)
        thread = threading.Thread(target=listen, args=(handle, listener), daemon=True)
        thread.start()
        listeners.append(listener)
        threads.append(thread)
    for thread in threads:
        thread.join()
    outbox.put(listeners)


def run_farm_level(celery, redis_url: str, clients: int, seconds: float) -> dict:
    """A level through Redis and Celery, read with the contract's ``stream_audio``."""
    return run_level(
        "farm",
        clients,
        seconds,
        lambda kwargs: celery.send_task(TASK_NAME, kwargs=kwargs).id,
        functools.partial(listen_to_farm, redis_url),
    )


def listen_to_farm(redis_url: str, job_id: str, listener: Listener) -> None:
    try:
        chunks = stream_audio(job_id, redis_url=redis_url, timeout_s=STREAM_TIMEOUT_S)
        first_id = None
        for chunk in chunks:
            listener.heard(len(chunk.pcm))
            first_id = first_id or chunks.last_id
        result = chunks.summary or {}
        timings = result.get("timings") or {}
        listener.note_hops(
            result.get("started_at"),
            timings.get("first_chunk_s"),
            timings.get("first_chunk_engine_s"),
            appended_at(first_id),
        )
    except Exception as error:  # noqa: BLE001 - reported in the table
        listener.error = repr(error)


def appended_at(entry_id: bytes | None) -> float | None:
    """When Redis appended a stream entry (epoch seconds, its clock: this host's), from the entry's id."""
    return None if entry_id is None else int(entry_id.split(b"-")[0]) / 1000


def run_web_level(base: str, clients: int, seconds: float) -> dict:
    """A level through the web's JSON API: submitted with ``stream``, read from ``/api/jobs/<id>/stream``."""
    import requests

    def submit(body: dict) -> dict:
        submitted = requests.post(f"{base}/api/jobs", json=body, timeout=60)
        submitted.raise_for_status()
        return submitted.json()

    return run_level("web", clients, seconds, submit, functools.partial(listen_to_web, base))


def listen_to_web(base: str, job: dict, listener: Listener) -> None:
    import requests

    try:
        with requests.get(f"{base}{job['stream_url']}?format=pcm", stream=True, timeout=STREAM_TIMEOUT_S) as answer:
            answer.raise_for_status()
            for piece in answer.iter_content(chunk_size=None):
                listener.heard(len(piece))
        # The job's row has its result once the web has heard that the job finished.
        deadline = time.monotonic() + RESULT_WAIT_S
        while (result := requests.get(f"{base}{job['status_url']}", timeout=60).json()["result"]) is None:
            if time.monotonic() > deadline:
                return
            time.sleep(0.2)
        started = datetime.fromisoformat(result["started_at"]).timestamp() if result["started_at"] else None
        listener.note_hops(started, result["first_chunk_s"], result["first_chunk_engine_s"])
    except Exception as error:  # noqa: BLE001 - reported in the table
        listener.error = repr(error)


@contextmanager
def running_web(redis_url: str, workdir: Path) -> Iterator[str]:
    """`chattts-farm web` (gunicorn, gevent) on the bench's Redis, with a database of its own and no
    per-key bounds in the way; its base URL once it answers."""
    import requests

    port = free_port()
    environment = {
        **os.environ,
        "CHATTTS_FARM_REDIS_URL": redis_url,
        "CHATTTS_FARM_DATABASE_URL": f"sqlite:///{(workdir / 'latency-web.db').resolve()}",
        "CHATTTS_FARM_RATE_LIMIT_PER_MINUTE": "1000000",
        "CHATTTS_FARM_MAX_WAITS_PER_KEY": "100000",
        "CHATTTS_FARM_DAILY_AUDIO_QUOTA_S": "1000000000",
    }
    (workdir / "latency-web.db").unlink(missing_ok=True)
    with (workdir / "latency-web.log").open("w") as log:
        web = subprocess.Popen(
            [sys.executable, "-m", "cli", "web", "--port", str(port), "--workers", "1"],
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WEB_START_TIMEOUT_S
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=2).ok:
                    break
            except (requests.ConnectionError, requests.Timeout):  # gunicorn's socket is open before its worker
                pass
            if web.poll() is not None or time.monotonic() > deadline:
                tail = (workdir / "latency-web.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the web did not start; the end of {workdir / 'latency-web.log'}:\n{tail}")
            time.sleep(0.2)
        yield base
    finally:
        web.terminate()
        web.wait(timeout=30)


def run_engine_level(synthesizer, clients: int, seconds: float, timeline: bool = False) -> dict:
    """A level through the synthesizer in this process: what the engine gives before any transport.

    With ``timeline``, prints each synthesizer step until every stream has its first chunk: when it
    began, how long it took, the segments running and waiting after it, and the streams heard by its end.
    """
    # Made before the clock starts, as the farm's and the web's clients make theirs before they submit.
    requests = level_requests(clients, seconds)
    started = time.perf_counter()
    listeners = [Listener(started) for _ in range(clients)]

    def on_audio(listener: Listener):
        return lambda segment, samples: listener.heard(samples.size * BYTES_PER_SAMPLE)

    synthesizer.add(requests, [on_audio(listener) for listener in listeners])
    steps = []
    while synthesizer.in_flight:
        began = time.perf_counter()
        synthesizer.step()
        heard = sum(bool(listener.arrivals) for listener in listeners)
        if timeline and (not steps or steps[-1][-1] < clients):
            engine = synthesizer.engine
            steps.append(
                (
                    began - started,
                    time.perf_counter() - began,
                    len(engine.running_segments),
                    len(engine.scheduler.waiting),
                    heard,
                )
            )
    if timeline:
        print(f"\nengine, {clients} streams: | step began ms | took ms | running | waiting | streams heard |")
        for began, took, running, waiting, heard in steps:
            print(f"| {1000 * began:.1f} | {1000 * took:.1f} | {running} | {waiting} | {heard} |")
    return level_row("engine", clients, listeners, time.perf_counter() - started)


def level_requests(clients: int, seconds: float) -> list:
    return standard_requests(clients, seed=WORKLOAD_SEED + clients, seconds=(seconds, seconds))


def level_row(path: str, clients: int, listeners: list[Listener], wall: float) -> dict:
    firsts = sorted(listener.first_chunk_s for listener in listeners if listener.first_chunk_s is not None)
    return {
        "path": path,
        "clients": clients,
        "failed": sum(listener.error is not None for listener in listeners),
        "p50_ms": percentile(firsts, 50) * 1000,
        "p95_ms": percentile(firsts, 95) * 1000,
        "p99_ms": percentile(firsts, 99) * 1000,
        "underruns": sum(listener.underruns for listener in listeners),
        "streams_with_underruns": sum(listener.underruns > 0 for listener in listeners),
        # What each piece of a stream costs (the engine's cut, launch and send, the worker's and Redis's
        # entries) is paid this many times a stream.
        "chunks_a_stream": sum(len(listener.arrivals) for listener in listeners) / max(1, len(listeners)),
        "audio_s": sum(listener.audio_s for listener in listeners),
        "wall_s": wall,
        # Each hop's p50 and p95 on its own (the p95s need not be one job's, nor add up to the row's); None
        # for a hop no job timed.
        "hops_ms": [
            (percentile(hop, 50) * 1000, percentile(hop, 95) * 1000) if hop else None
            for hop in (
                sorted(figure for figure in figures if figure is not None)
                for figures in zip(*(listener.hops for listener in listeners if listener.hops), strict=True)
            )
        ],
    }


# What each worker's health reports of its engine's thread, summed over the workers level by level.
ENGINE_FIGURES = (
    "in_steps_s",
    "waiting_for_device_s",
    "pinned_blocks_made",
    "pinned_alloc_s",
    "device_blocks_made",
    "device_alloc_retries",
)


class EngineThreads:
    """The workers' engine threads, level by level (ENGINE_FIGURES): seconds in steps, and of those
    waiting for the device (see worker.engine.device_waits); pinned memory blocks made, and the seconds
    that took; device memory blocks made, and the allocator's retries (see worker.engine_report), from
    each worker's health."""

    def __init__(self, celery):
        self.celery = celery
        # One queue a GPU (or CPU worker), whichever of its Celery processes answers.
        self.queues = sorted({queue_of_worker(name) for reply in celery.control.ping(timeout=1.0) for name in reply})
        self._last = self._read()

    def _read(self) -> dict[str, float]:
        time.sleep(ENGINE_REPORT_SETTLE_S)
        reports = [self.celery.send_task("chattts.health", queue=queue).get(timeout=60) for queue in self.queues]
        return {figure: sum(report[figure] for report in reports) for figure in ENGINE_FIGURES}

    def since_last(self) -> dict[str, float]:
        """Each figure's growth since the last call (or the start)."""
        now = self._read()
        spent = {figure: now[figure] - self._last[figure] for figure in ENGINE_FIGURES}
        self._last = now
        return spent


def run_plain(celery, clients: int, seconds: float) -> float:
    """Audio-s per wall-s of the same level not streamed: the throughput streaming is measured against."""
    requests = level_requests(clients, seconds)
    started = time.perf_counter()
    sent = [celery.send_task(TASK_NAME, kwargs=request.as_arguments()) for request in requests]
    audio_s = sum(result.get(timeout=600)["duration_s"] for result in sent)
    return audio_s / (time.perf_counter() - started)


def run_engine_levels(arguments: argparse.Namespace, levels: list[int]) -> list[dict]:
    """Every level through a synthesizer loaded here, which is freed before the workers load theirs."""
    from bench.device import free_memory
    from worker.engine_process.pipeline import Synthesizer

    settings = Settings.from_env(
        model=arguments.model,
        device="cpu" if arguments.cpu else "cuda",
        slots=arguments.slots,
        quality_retries=0,
    )
    synthesizer = Synthesizer.load(settings)
    run_engine_level(synthesizer, 4, arguments.seconds)  # warm-up, as the farm's
    rows = [run_engine_level(synthesizer, clients, arguments.seconds, arguments.timeline) for clients in levels]
    device = synthesizer.model.device
    del synthesizer
    free_memory(device)
    return rows


def print_rounds(rounds: list[tuple[float, dict]], closing_plain: float) -> None:
    """The --in-turn rounds: each streamed level against the mean of the unstreamed levels before and after
    it (the next round's, or the closing one), and the median of those shares."""
    print(
        "\nstreamed and not, in turn (each streamed level against the mean of the unstreamed levels on either "
        "side of it):\n"
    )
    print(
        "| round | not streamed audio-s/s | streamed audio-s/s | first chunk p95 ms | underruns (streams) "
        "| failed | streamed / unstreamed beside it |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    afters = [unstreamed for unstreamed, _ in rounds[1:]] + [closing_plain]
    shares = []
    for number, ((before, row), after) in enumerate(zip(rounds, afters, strict=True), start=1):
        streamed = row["audio_s"] / row["wall_s"]
        shares.append(streamed / ((before + after) / 2))
        print(
            f"| {number} | {before:.1f} | {streamed:.1f} | {row['p95_ms']:.0f} "
            f"| {row['underruns']} ({row['streams_with_underruns']}) | {row['failed']} | {shares[-1]:.1%} |"
        )
    print(
        f"\nstreamed / unstreamed over {len(shares)} rounds: median {statistics.median(shares):.1%}, "
        f"least {min(shares):.1%}, most {max(shares):.1%}"
    )


def percentile(values: list[float], rank: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(rank / 100 * (len(values) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic-tiny")
    parser.add_argument("--cpu", type=int, default=0, help="CPU workers (default: GPU workers).")
    parser.add_argument("--gpus", default="0")
    parser.add_argument("--clients", default="1,8,64,256", help="Numbers of clients at once, comma-separated.")
    parser.add_argument("--seconds", type=float, default=10.0, help="Speech per job.")
    parser.add_argument("--jobs-in-flight", type=int, default=512)
    parser.add_argument("--slots", type=int, default=0, help="Engine slots (0: from free memory).")
    parser.add_argument(
        "--web", action="store_true", help="Also run the levels through `chattts-farm web` (JSON API and stream)."
    )
    parser.add_argument(
        "--engine", action="store_true", help="Also run the levels through the synthesizer in this process first."
    )
    parser.add_argument(
        "--timeline", action="store_true", help="Print the engine's steps of each --engine level until all are heard."
    )
    parser.add_argument(
        "--plain-first",
        action="store_true",
        help="Also run the last level not streamed before the streamed levels: whether what a worker's first "
        "level loses is streaming's or any first level's.",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="Sample the workers' engine processes with py-spy (native stacks) over each level, into DIR, and "
        "print where each of their threads was (bench.py_spy); the sampling slows the levels.",
    )
    parser.add_argument(
        "--in-turn",
        type=int,
        default=0,
        metavar="N",
        help="After the other levels, N rounds of the last level not streamed and then streamed; each streamed "
        "level against the unstreamed ones on either side of it, and the median share.",
    )
    parser.add_argument("--redis-server", help="The redis-server to start (default: the one on PATH).")
    parser.add_argument("--workdir", default="var/bench")
    arguments = parser.parse_args()

    workdir = Path(arguments.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    placement = ["--cpu", str(arguments.cpu)] if arguments.cpu else ["--gpus", arguments.gpus]
    levels = [int(n) for n in arguments.clients.split(",")]
    rows = run_engine_levels(arguments, levels) if arguments.engine else []
    with bench_redis(workdir, arguments.redis_server) as redis_url:
        celery = create_celery(Settings.from_env(redis_url=redis_url))
        settings = {
            "CHATTTS_FARM_REDIS_URL": redis_url,
            "CHATTTS_FARM_MODEL": arguments.model,
            "CHATTTS_FARM_MAX_JOBS_IN_FLIGHT": str(arguments.jobs_in_flight),
            "CHATTTS_FARM_SLOTS": str(arguments.slots),
            "CHATTTS_FARM_QUALITY_RETRIES": "0",
        }
        with running_workers(celery, placement, settings, workdir / "latency-worker.log") as supervisor:
            run_farm_level(celery, redis_url, 4, arguments.seconds)  # warm-up: first graphs, first connections
            engines = EngineThreads(celery)
            redis_pid = redis_server_pid(redis_url)
            processes = ProcessUsage({**worker_pids(celery, engines.queues, supervisor), "redis": lambda: [redis_pid]})
            threads = []  # (path, clients, wall s, engine thread seconds, the processes' CPU s and page faults)
            samples = []  # with --py-spy: (path, clients, the engine processes' samples)

            def measured(path: str, clients: int, wall: float) -> None:
                threads.append((path, clients, wall, engines.since_last(), processes.since_last()))

            @contextlib.contextmanager
            def sampled(path: str, clients: int):
                if arguments.py_spy is None:
                    yield
                    return
                label = f"{len(samples) + 1:02d}-{path.replace(', ', '-').replace(' ', '-')}-{clients}"
                with py_spy.recording(processes.pids["engine"](), arguments.py_spy, label) as files:
                    yield
                samples.append((path, clients, files))

            def plain_level(path: str) -> float:
                started = time.perf_counter()
                with sampled(path, levels[-1]):
                    throughput = run_plain(celery, levels[-1], arguments.seconds)
                measured(path, levels[-1], time.perf_counter() - started)
                return throughput

            plain_first = plain_level("farm, not streamed, first") if arguments.plain_first else None
            for clients in levels:
                with sampled("farm", clients):
                    rows.append(run_farm_level(celery, redis_url, clients, arguments.seconds))
                measured("farm", clients, rows[-1]["wall_s"])
            if arguments.web:
                with running_web(redis_url, workdir) as base:
                    # Warm-up, as the farm's: a fresh web process's first requests open its database, its
                    # Redis pools and its Celery producer (its first chunk at one client came ~60 ms late).
                    run_web_level(base, 4, arguments.seconds)
                    engines.since_last()
                    processes.since_last()
                    for clients in levels:
                        with sampled("web", clients):
                            rows.append(run_web_level(base, clients, arguments.seconds))
                        measured("web", clients, rows[-1]["wall_s"])
            rounds = []  # (the unstreamed level's audio-s/s, then the streamed level's row)
            for _ in range(arguments.in_turn):
                unstreamed = plain_level("farm, not streamed, in turn")
                with sampled("farm, in turn", levels[-1]):
                    streamed = run_farm_level(celery, redis_url, levels[-1], arguments.seconds)
                measured("farm, in turn", levels[-1], streamed["wall_s"])
                rounds.append((unstreamed, streamed))
            plain = plain_level("farm, not streamed")
    print(
        f"\nmodel {arguments.model}, worker {' '.join(placement)}, {arguments.seconds:g} s of speech a job, "
        f"streaming through Redis + Celery (chattts_farm.streams.stream_audio), all of a level submitted at once\n"
    )
    print(
        "| path | clients | failed | first chunk p50 ms | p95 ms | p99 ms | underruns (streams) | chunks a stream "
        "| audio-s/s | of the farm not streamed |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        throughput = row["audio_s"] / row["wall_s"]
        print(
            f"| {row['path']} | {row['clients']} | {row['failed']} "
            f"| {row['p50_ms']:.0f} | {row['p95_ms']:.0f} | {row['p99_ms']:.0f} "
            f"| {row['underruns']} ({row['streams_with_underruns']}) | {row['chunks_a_stream']:.1f} "
            f"| {throughput:.1f} | {throughput / plain:.0%} |"
        )
    no_streams = " |" * 6  # an unstreamed level has no chunks to time or count
    if plain_first is not None:
        share = plain_first / plain
        print(f"| farm, not streamed, first | {levels[-1]} |{no_streams} {plain_first:.1f} | {share:.0%} |")
    print(f"| farm, not streamed | {levels[-1]} |{no_streams} {plain:.1f} | |")
    if rounds:
        print_rounds(rounds, plain)
    print("\nwhere the first chunks waited, p50 / p95 ms of each hop (from the jobs' results):\n")
    print(
        "| path | clients | submit -> engine starts the job | -> the engine process sends its first audio "
        "| -> the worker's Celery process | -> appended to the Redis stream | -> the client |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        if row["hops_ms"]:
            hops = " | ".join("-" if hop is None else f"{hop[0]:.0f} / {hop[1]:.0f}" for hop in row["hops_ms"])
            print(f"| {row['path']} | {row['clients']} | {hops} |")
    print(
        "\nthe engines' threads, level by level (from the workers' health; the level's wall runs from its first "
        "submit to its last chunk heard):\n"
    )
    print(
        "| path | clients | level wall s | in steps s | waiting for the device s | host's own work s "
        "| pinned blocks made | making them s | device blocks made | allocator retries |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path, clients, wall, spent, _ in threads:
        in_steps, waiting = spent["in_steps_s"], spent["waiting_for_device_s"]
        print(
            f"| {path} | {clients} | {wall:.2f} | {in_steps:.2f} | {waiting:.2f} | {in_steps - waiting:.2f} "
            f"| {spent['pinned_blocks_made']:.0f} | {spent['pinned_alloc_s']:.2f} "
            f"| {spent['device_blocks_made']:.0f} | {spent['device_alloc_retries']:.0f} |"
        )
    print(
        "\nthe workers' processes and Redis, level by level: CPU seconds and minor page faults (each a page of "
        "memory touched for the first time since it was allocated; from /proc):\n"
    )
    kinds = {"celery": "Celery", "engine": "engine", "redis": "Redis"}
    print("| path | clients | " + " | ".join(f"{name} CPU s | {name} page faults" for name in kinds.values()) + " |")
    print("|---|---:|" + "---:|---:|" * len(kinds))
    for path, clients, _, _, used in threads:
        cells = " | ".join(f"{used[kind][0]:.2f} | {used[kind][1]}" for kind in kinds)
        print(f"| {path} | {clients} | {cells} |")
    for path, clients, files in samples:
        for file in files:
            print(f"\nwhere an engine process's threads were, {path}, {clients} clients (py-spy):\n")
            print(py_spy.summary(file))


if __name__ == "__main__":
    main()
