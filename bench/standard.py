"""The standard workload, run every way the farm can serve it, side by side in one process on one device.

    python -m bench.standard --model synthetic-full --device cuda --jobs 512 --stock 2 --soak-s 600 \\
        --json standard.json
    python -m bench.standard --model synthetic-tiny --device cpu --jobs 6 --stock 1 --soak-s 5 \\
        --soak-every-s 1 --seconds 1-2

From the repository root (``bench`` is not an installed package; ``python -m`` puts the root on the path).

The workload (:func:`bench.workload.standard_requests`): ``--jobs`` requests, all submitted at once,
in mixed voices, each one sentence whose speech lasts a duration drawn uniformly from ``--seconds``
(5-15 s: a mean of 10 s, ~470 tokens) from a fixed seed, with fixed audio seeds. The synthetic
length rule gives each text its length. 15 s of speech takes ~290 characters, past the default
``max_segment_chars`` (120): this bench sets it to 400 (engine and workers alike), so every text
stays one segment. Quality retries are off, as in ``bench/synthesis.py``.

Modes, in this order:

- ``engine, batch 1``: one request of the mean length alone (its RTF, wall over audio, is printed);
- ``engine alone``: ``Synthesizer.synthesize`` on the whole workload at once: ``--slots`` segments run
  (the rest wait for a free slot); a job's latency runs from the call to the moment ``on_progress``
  reports it done;
- ``stock ChatTTS, serial``: the first ``--stock`` requests, one ``Chat.infer`` each, on the same
  loaded model (lengths pinned for random weights); a job's latency runs from the start of the mode;
- ``engine soak``: ``--soak-s`` seconds of workloads (a new draw each call) through the engine, the
  GPU memory sampled every ``--soak-every-s`` seconds in a table of its own; latency as in
  ``engine alone``, from each job's call;
- ``farm (Redis + Celery)``: after the engine's model is freed, a redis-server and a
  ``chattts-farm worker`` of their own with the same slots, every job sent at once by Celery clients
  in several processes, as a farm's many callers send them (bench.farm.senders; the worker holds
  ``--jobs-in-flight`` of them, the rest wait in Redis); a job's latency runs from its submit to its
  result.

Each mode is warmed up first, untimed, with a workload drawn from another seed. Peak memory is
``torch.cuda.memory_stats``' peak allocated and reserved (in the workers' process for the farm, as
its results report them), fragmentation is 1 - peak allocated / peak reserved, and segments is the
allocator's peak count of segments (``segment.all``); on the CPU there are none ("-"). Prints one
Markdown table of every mode last, then the soak's table.

Under the table, where the farm's jobs spent their time, split at the times their results give: submit,
a worker's taking the job off its queue, the engine's start of it, its end, the result stored, the result
read. With ``--py-spy DIR``, py-spy samples the workers' engine and Celery processes over each farm
run's workload and a table says where each of their threads was (bench.py_spy).

Farm runs on several GPUs (``--farm-gpus 0 --farm-gpus 0,1``; on the CPU ``--farm-cpus 1 --farm-cpus 2``,
not a performance claim) with ``--jobs-per-worker`` send ``--jobs`` jobs for each GPU they have, and each
run on several is printed as a multiple of the first run on one, with both p95 latencies.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from worker.cuda import configure_allocator

configure_allocator()

import torch  # noqa: E402 - the allocator setting must come first
from celery import Celery  # noqa: E402
from celery.result import ResultSet  # noqa: E402

from bench import py_spy  # noqa: E402
from bench.device import free_memory, synchronize  # noqa: E402
from bench.farm import (  # noqa: E402
    SENDER_PROCESSES,
    Sent,
    bench_redis,
    cpu_used,
    percentile,
    running_workers,
    senders,
    worker_pids,
)
from bench.workload import STANDARD_SEGMENT_CHARS, standard_requests, stock_infer  # noqa: E402
from chattts_farm.celery_client import create_celery  # noqa: E402
from chattts_farm.contract import SynthesisRequest, worker_queue  # noqa: E402
from chattts_farm.settings import Settings  # noqa: E402
from chattts_farm.speech_length import expected_tokens  # noqa: E402
from worker.engine_process.pipeline import Synthesizer  # noqa: E402

WORKLOAD_SEED = 0
WARM_UP_SEED = 1
# The warm-ups capture the graphs and fill the allocator; a part of the workload is enough.
WARM_UP_JOBS = 256
SOAK_SEED = 1000  # the soak's n-th call draws seed SOAK_SEED + n
FARM_TIMEOUT_S = 3600
MIB = 2**20


@dataclass
class Memory:
    allocated_mib: float
    reserved_mib: float
    segments: int | None  # the allocator's segments; the farm's results do not report them

    @property
    def fragmentation(self) -> float:
        return 1 - self.allocated_mib / self.reserved_mib if self.reserved_mib else 0.0

    @classmethod
    def of(cls, device: torch.device, which: str) -> Memory | None:
        """The allocator's ``current`` or ``peak`` figures on ``device``; None off CUDA."""
        if device.type != "cuda":
            return None
        stats = torch.cuda.memory_stats(device)
        return cls(
            stats.get(f"allocated_bytes.all.{which}", 0) / MIB,
            stats.get(f"reserved_bytes.all.{which}", 0) / MIB,
            stats.get(f"segment.all.{which}", 0),
        )

    @classmethod
    def highest(cls, memories: list[Memory | None]) -> Memory | None:
        known = [m for m in memories if m is not None]
        if not known:
            return None
        segments = [m.segments for m in known if m.segments is not None]
        return cls(
            max(m.allocated_mib for m in known),
            max(m.reserved_mib for m in known),
            max(segments) if segments else None,
        )


@dataclass
class ModeResult:
    mode: str
    jobs: int
    done: int
    audio_s: float
    wall_s: float
    latencies_s: list[float] = field(repr=False)  # of the jobs done
    memory: Memory | None
    # CPU seconds used by the farm's Celery, encoder and engine processes, or by the engine alone's process.
    cpu_s: dict[str, float] | None = None
    # Of the farm's run: how long its clients took to send every job, and where each job done spent its
    # time (see FarmHops).
    sent_s: float | None = None
    hops: list[FarmHops] | None = field(default=None, repr=False)
    workers: int = 0  # of a farm run: its GPUs (or CPU workers)
    samples: list[Path] = field(default_factory=list, repr=False)  # with --py-spy: its processes' recordings

    @property
    def audio_per_wall(self) -> float:
        return self.audio_s / self.wall_s

    def latency(self, fraction: float) -> float | None:
        return percentile(self.latencies_s, fraction)

    def headline(self) -> str:
        """The mode's figures in a line, printed as it ends: a run cut off later (a device call's time
        limit) still shows every mode it finished."""
        line = (
            f"{self.mode}: {self.done} of {self.jobs} jobs, {self.audio_s:.1f} audio s in {self.wall_s:.2f} s, "
            f"{self.audio_per_wall:.1f} audio-s/s, latency p50 {cell(self.latency(0.5), 2)} s, "
            f"p95 {cell(self.latency(0.95), 2)} s"
        )
        if self.hops:
            to_engine_start = [hop.to_engine_start for hop in self.hops]
            line += (
                f"; submit -> engine starts p50 {cell(percentile(to_engine_start, 0.5), 2)} s, "
                f"p95 {cell(percentile(to_engine_start, 0.95), 2)} s"
            )
        return line

    def as_dict(self) -> dict:
        figures = asdict(self)
        del figures["latencies_s"], figures["hops"], figures["samples"]
        return {
            **figures,
            "audio_per_wall": self.audio_per_wall,
            "rtf": self.wall_s / self.audio_s if self.audio_s else None,
            "p50_latency_s": self.latency(0.5),
            "p95_latency_s": self.latency(0.95),
            "max_latency_s": max(self.latencies_s, default=None),
            "fragmentation": None if self.memory is None else self.memory.fragmentation,
        }


@dataclass
class Finished:
    """One job of a timed run: when it was submitted and done, and its audio seconds (None when it failed)."""

    submitted: float
    at: float
    audio_s: float | None


class FarmHops(NamedTuple):
    """Where a farm job's latency went (seconds), from its result's times: from its submit to a worker's
    taking it (Redis, Celery's delivery to a job thread), from there to its start in the engine (the
    engine process's channel, a place in the engine), its time in the engine (preparing, generating,
    decoding), from there to the worker's writing its audio and result (the channel, the Celery process's
    job thread, the audio store), and from there to the client (Celery's result store, its message to
    the client)."""

    to_worker: float
    to_engine: float
    in_engine: float
    to_worker_done: float
    to_client: float

    @classmethod
    def of(cls, sent_wall: float, result: dict, received_wall: float) -> FarmHops:
        timings = result["timings"]
        in_engine = timings["text_s"] + timings["generate_s"] + timings["decode_s"]
        taken, started, finished = result["received_at"], result["started_at"], result["finished_at"]
        return cls(
            taken - sent_wall, started - taken, in_engine, finished - started - in_engine, received_wall - finished
        )

    @property
    def to_engine_start(self) -> float:
        return self.to_worker + self.to_engine


@dataclass
class SoakSample:
    t_s: float  # since the soak began
    memory: Memory | None
    audio_per_wall: float | None  # in the interval since the sample before


def progress(message: str) -> None:
    """A line on stderr as each part begins, so a long run shows where it is."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def finished(results: list[ModeResult], result: ModeResult) -> None:
    results.append(result)
    progress(result.headline())


def synthesize_timed(synthesizer: Synthesizer, requests: list[SynthesisRequest]) -> tuple[float, list[Finished]]:
    """One synthesize call: when it began, and each request's end.

    A request ends when ``on_progress`` reports it done (fraction 1.0), or, where the engine reports
    no request before the call returns, when the call returns.
    """
    done_at: dict[int, float] = {}

    def on_progress(index: int, fraction: float, done: int, total: int) -> None:
        if fraction >= 1.0:
            done_at.setdefault(index, time.perf_counter())

    started = time.perf_counter()
    outcomes = synthesizer.synthesize(requests, on_progress=on_progress)
    synchronize(synthesizer.model.device)
    returned = time.perf_counter()
    return started, [
        Finished(started, done_at.get(index, returned), None if isinstance(outcome, Exception) else outcome.duration_s)
        for index, outcome in enumerate(outcomes)
    ]


def mode_result(mode: str, started: float, ended: float, finished: list[Finished], memory: Memory | None) -> ModeResult:
    done = [f for f in finished if f.audio_s is not None]
    return ModeResult(
        mode,
        jobs=len(finished),
        done=len(done),
        audio_s=sum(f.audio_s for f in done),
        wall_s=ended - started,
        latencies_s=[f.at - f.submitted for f in done],
        memory=memory,
    )


def run_engine(synthesizer: Synthesizer, mode: str, requests: list[SynthesisRequest]) -> ModeResult:
    """The workload in one synthesize call (which resets the peak memory figures itself), with the CPU this
    process used meanwhile: the engine process's share of the farm's CPU, had it nothing else to do."""
    cpu_started = time.process_time()
    started, finished = synthesize_timed(synthesizer, requests)
    result = mode_result(mode, started, time.perf_counter(), finished, Memory.of(synthesizer.model.device, "peak"))
    result.cpu_s = {"engine": time.process_time() - cpu_started}
    return result


def run_stock(synthesizer: Synthesizer, requests: list[SynthesisRequest]) -> ModeResult:
    """Stock ChatTTS serving the requests one after another, all of them waiting from the start."""
    model = synthesizer.model

    def pinned(request: SynthesisRequest) -> int | None:
        return expected_tokens(request.text, request.speed) if model.is_synthetic else None

    stock_infer(model.chat, requests[0], pinned(requests[0]))  # its own warm-up
    synchronize(model.device)
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(model.device)
    started = time.perf_counter()
    finished = []
    for request in requests:
        audio_s = stock_infer(model.chat, request, pinned(request))
        synchronize(model.device)
        finished.append(Finished(started, time.perf_counter(), audio_s))
    return mode_result("stock ChatTTS, serial", started, time.perf_counter(), finished, Memory.of(model.device, "peak"))


class MemorySampler:
    """Samples the allocator's current figures every ``every_s`` seconds from a thread, while in use."""

    def __init__(self, device: torch.device, every_s: float):
        self.device = device
        self.every_s = every_s
        self.samples: list[tuple[float, Memory | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def __enter__(self) -> MemorySampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exception) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def _sample(self) -> None:
        self.samples.append((time.perf_counter(), Memory.of(self.device, "current")))


def run_soak(
    synthesizer: Synthesizer, jobs: int, seconds: tuple[float, float], soak_s: float, every_s: float
) -> tuple[ModeResult, list[SoakSample]]:
    """Workloads through the engine, one call after another, for ``soak_s`` seconds (the last call ends)."""
    device = synthesizer.model.device
    finished: list[Finished] = []
    peaks: list[Memory | None] = []
    with MemorySampler(device, every_s) as sampler:
        started = sampler.samples[0][0]
        call = 0
        while time.perf_counter() - started < soak_s:
            requests = standard_requests(jobs, seed=SOAK_SEED + call, seconds=seconds)
            finished.extend(synthesize_timed(synthesizer, requests)[1])
            peaks.append(Memory.of(device, "peak"))  # of this call: each call resets the peaks
            call += 1
    result = mode_result("engine soak", started, sampler.samples[-1][0], finished, Memory.highest(peaks))
    series = [SoakSample(0.0, sampler.samples[0][1], None)]
    for (before, _), (at, memory) in zip(sampler.samples, sampler.samples[1:], strict=False):
        audio_s = sum(f.audio_s for f in finished if f.audio_s is not None and before < f.at <= at)
        series.append(SoakSample(at - started, memory, audio_s / (at - before) if at > before else None))
    return result, series


def run_farm(
    arguments: argparse.Namespace,
    warm_up: list[SynthesisRequest],
    requests: list[SynthesisRequest],
    placement: list[str],
    celery_processes: int = 0,
    named: str = "",
) -> ModeResult:
    """The workload through Redis and a `chattts-farm worker PLACEMENT` of its own (``--gpus 0,1`` or
    ``--cpu N``); ``named`` is added to the mode's name."""
    count = worker_count(placement)
    kind = "gpu" if placement[0] == "--gpus" else "cpu"
    indices = [int(index) for index in placement[1].split(",")] if kind == "gpu" else range(count)
    queues = [worker_queue(kind, index) for index in indices]
    workdir = Path(arguments.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with bench_redis(workdir, arguments.redis_server) as redis_url:
        client = create_celery(Settings.from_env(redis_url=redis_url))
        settings = {
            "CHATTTS_FARM_REDIS_URL": redis_url,
            "CHATTTS_FARM_MODEL": arguments.model,
            "CHATTTS_FARM_DEVICE": "cuda" if kind == "gpu" else "cpu",  # the supervisor pins each worker to its GPU
            "CHATTTS_FARM_MAX_JOBS_IN_FLIGHT": str(arguments.jobs_in_flight),
            "CHATTTS_FARM_SLOTS": str(arguments.slots),
            "CHATTTS_FARM_KV_DTYPE": arguments.kv_dtype,
            "CHATTTS_FARM_MAX_SEGMENT_CHARS": str(STANDARD_SEGMENT_CHARS),
            "CHATTTS_FARM_QUALITY_RETRIES": "0",
            "CHATTTS_FARM_CELERY_PROCESSES": str(celery_processes),
        }
        progress(f"farm: starting a worker ({' '.join(placement)}); its log: {workdir / 'standard-worker.log'}")
        with (
            running_workers(client, placement, settings, workdir / "standard-worker.log") as supervisor,
            senders(redis_url) as send,
        ):
            progress("farm: warming up")
            through_farm(client, send, warm_up)
            progress("farm: the workload")
            pids = worker_pids(client, queues, supervisor)
            sampled = (
                py_spy.recording(pids["engine"]() + pids["celery"](), arguments.py_spy, f"farm-{celery_processes}")
                if arguments.py_spy
                else contextlib.nullcontext([])
            )
            with cpu_used(pids) as used, sampled as samples:
                result = through_farm(client, send, requests)
            result.cpu_s = used
            result.samples = samples
    result.mode += named
    result.workers = count
    if celery_processes:
        result.mode += f", {celery_processes} Celery process{'es' if celery_processes > 1 else ''} a GPU"
    return result


def worker_count(placement: list[str]) -> int:
    """The GPUs (``--gpus 0,1``) or CPU workers (``--cpu N``) a placement has."""
    return len(placement[1].split(",")) if placement[0] == "--gpus" else int(placement[1])


def farm_placements(arguments: argparse.Namespace, device: torch.device) -> list[tuple[list[str], str]]:
    """Each farm run's `chattts-farm worker` placement and what its mode's name says of it: the
    ``--farm-gpus`` and ``--farm-cpus`` asked for, else one run on the engine's device."""
    placements = [(["--gpus", gpus], f", GPUs {gpus}") for gpus in arguments.farm_gpus or []]
    placements += [
        (["--cpu", str(count)], f", {count} CPU worker{'s' if count > 1 else ''}")
        for count in arguments.farm_cpus or []
    ]
    if placements:
        return placements
    return [(["--gpus", gpu_number(device)] if device.type == "cuda" else ["--cpu", "1"], "")]


def print_scaling(results: list[ModeResult]) -> None:
    """Each farm run on several GPUs (or CPU workers) against the first farm run on one: its audio-s per
    wall-s as a multiple of that run's, and both p95 latencies."""
    base = next((r for r in results if r.workers == 1), None)
    if base is None or not base.audio_per_wall:
        return
    for run in results:
        if run.workers > 1:
            print(
                f"\n{run.mode}: {run.audio_per_wall / base.audio_per_wall:.2f} x the audio-s/s of {base.mode} "
                f"({run.jobs} jobs against {base.jobs}); p95 latency {cell(run.latency(0.95), 2)} s against "
                f"{cell(base.latency(0.95), 2)} s"
            )


def gpu_number(device: torch.device) -> str:
    """The number `chattts-farm worker --gpus` knows this process's CUDA device by (nvidia-smi's)."""
    index = device.index or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[index].strip() if visible else str(index)


def through_farm(
    client: Celery, send: Callable[[list[dict]], list[Sent]], requests: list[SynthesisRequest]
) -> ModeResult:
    """Send every request at once (from several client processes: see bench.farm.senders), then take each
    result as it comes."""
    started = time.perf_counter()
    sent = {job.task_id: job for job in send([request.as_arguments() for request in requests])}
    finished: list[Finished] = []
    hops: list[FarmHops] = []
    memories: list[Memory | None] = []

    def on_result(task_id: str, value) -> None:
        job = sent[task_id]
        if not isinstance(value, dict):  # a failed job: its exception
            finished.append(Finished(job.at, time.perf_counter(), None))
            return
        finished.append(Finished(job.at, time.perf_counter(), value["duration_s"]))
        hops.append(FarmHops.of(job.wall, value, time.time()))
        memory = value["memory"]
        if memory:
            memories.append(Memory(memory["peak_allocated_mb"], memory["peak_reserved_mb"], None))

    results = ResultSet([client.AsyncResult(task_id) for task_id in sent])
    results.join_native(timeout=FARM_TIMEOUT_S, callback=on_result, propagate=False)
    result = mode_result("farm (Redis + Celery)", started, time.perf_counter(), finished, Memory.highest(memories))
    result.sent_s = max(job.at for job in sent.values()) - started
    result.hops = hops
    return result


def seconds_range(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    bounds = (float(low), float(high or low))
    if not 0 < bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: want LOW-HIGH seconds, 0 < LOW <= HIGH")
    return bounds


def cell(value: float | int | None, digits: int) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def print_tables(results: list[ModeResult], soak: list[SoakSample]) -> None:
    print(
        "| mode | jobs | done | audio s | wall s | audio-s/s | p50 latency s | p95 latency s "
        "| peak alloc MiB | peak reserved MiB | fragmentation | segments |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        m = r.memory
        cells = (
            r.mode,
            r.jobs,
            r.done,
            cell(r.audio_s, 1),
            cell(r.wall_s, 2),
            cell(r.audio_per_wall, 1),
            cell(r.latency(0.5), 2),
            cell(r.latency(0.95), 2),
            cell(m and m.allocated_mib, 0),
            cell(m and m.reserved_mib, 0),
            cell(m and m.fragmentation, 3),
            cell(m and m.segments, 0),
        )
        print("| " + " | ".join(str(c) for c in cells) + " |")
    for r in results:
        if r.mode == "engine, batch 1" and r.audio_s:
            print(f"\nbatch 1: RTF {r.wall_s / r.audio_s:.3f} (wall s over audio s)")
    for r in results:
        if r.cpu_s is not None and r.done and "celery" not in r.cpu_s:
            print(
                f"\n{r.mode}: CPU a job in its process {1000 * r.cpu_s['engine'] / r.done:.1f} ms "
                f"({r.cpu_s['engine'] / r.wall_s:.2f} cores busy)"
            )
        elif r.cpu_s is not None and r.done:
            print(
                f"\n{r.mode}: CPU a job in the workers' Celery processes {1000 * r.cpu_s['celery'] / r.done:.1f} ms "
                f"({r.cpu_s['celery'] / r.wall_s:.2f} cores busy), their encoder processes "
                f"{1000 * r.cpu_s['encoders'] / r.done:.1f} ms, their engine processes "
                f"{1000 * r.cpu_s['engine'] / r.done:.1f} ms ({r.cpu_s['engine'] / r.wall_s:.2f} cores busy); "
                f"its {SENDER_PROCESSES} client processes sent every job in {r.sent_s:.2f} s"
            )
    farms = [r for r in results if r.hops]
    if farms:
        print(
            "\nwhere the farm's jobs spent their time, p50 / p95 s of each part on its own (from the jobs' results):\n"
        )
        print(
            "| farm run | submit -> a worker takes the job | -> the engine starts it | -> the engine has it done "
            "| -> the worker has written it | -> the client has its result |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for r in farms:
            parts = zip(*r.hops, strict=True)
            cells = (f"{percentile(part, 0.5):.2f} / {percentile(part, 0.95):.2f}" for part in parts)
            print(f"| {r.mode} | " + " | ".join(cells) + " |")
    for r in results:
        for recording in r.samples:
            print(f"\nwhere a worker process's threads were over {r.mode}'s workload (py-spy):\n")
            print(py_spy.summary(recording))
    if soak:
        print(
            "\nsoak: the allocator's current figures at each sample; audio-s/s of the jobs done since the one before\n"
        )
        print("| t s | allocated MiB | reserved MiB | fragmentation | segments | audio-s/s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for s in soak:
            m = s.memory
            cells = (
                cell(s.t_s, 1),
                cell(m and m.allocated_mib, 0),
                cell(m and m.reserved_mib, 0),
                cell(m and m.fragmentation, 3),
                cell(m and m.segments, 0),
                cell(s.audio_per_wall, 1),
            )
            print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic-full")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--jobs", type=int, default=512, help="Jobs of the workload, all submitted at once.")
    parser.add_argument(
        "--slots", type=int, default=0, help="Segments the engine runs at once (0: as many as the memory holds)."
    )
    parser.add_argument("--jobs-in-flight", type=int, default=768, help="Jobs the farm's worker holds at once.")
    parser.add_argument("--kv-dtype", default="model", choices=("model", "fp8"), help="The KV cache's dtype.")
    parser.add_argument("--seconds", type=seconds_range, default=(5.0, 15.0), help="Speech per job, LOW-HIGH s.")
    parser.add_argument("--stock", type=int, default=2, help="Jobs through stock ChatTTS, serially.")
    parser.add_argument("--skip-stock", action="store_true")
    parser.add_argument("--skip-farm", action="store_true")
    parser.add_argument(
        "--farm-gpus",
        action="append",
        help="GPUs of a farm run, as `chattts-farm worker --gpus` takes them (0,1); repeat for several runs. "
        "Default: one run on the engine's GPU.",
    )
    parser.add_argument(
        "--farm-cpus",
        type=int,
        action="append",
        help="CPU workers of a farm run, as `chattts-farm worker --cpu` takes them; repeat for several runs "
        "(the CPU's stand-in for --farm-gpus: not a performance claim).",
    )
    parser.add_argument(
        "--jobs-per-worker",
        action="store_true",
        help="Each farm run sends --jobs jobs for every GPU (or CPU worker) it has: two GPUs the load of one, "
        "twice; a run on several is then compared with the run on one.",
    )
    parser.add_argument(
        "--celery-processes",
        default="0",
        help="Celery processes a GPU for the farm runs, comma-separated: a run each (0: the default).",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="Sample each farm run's engine and Celery processes with py-spy (native stacks) over its workload, "
        "into DIR, and print where their threads were (bench.py_spy); the sampling slows the runs.",
    )
    parser.add_argument("--soak-s", type=float, default=0, help="Seconds of soak through the engine (0: none).")
    parser.add_argument("--soak-every-s", type=float, default=30, help="Seconds between the soak's samples.")
    parser.add_argument("--redis-server", help="The redis-server to start (default: the one on PATH).")
    parser.add_argument("--workdir", default="var/bench", help="Where Redis and the worker log go.")
    parser.add_argument("--json", help="Also write every figure to this file.")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("ChatTTS").setLevel(logging.ERROR)

    settings = Settings.from_env(
        model=arguments.model,
        device=arguments.device,
        slots=arguments.slots,
        kv_dtype=arguments.kv_dtype,
        max_segment_chars=STANDARD_SEGMENT_CHARS,
        quality_retries=0,
    )
    progress(f"loading {arguments.model}")
    synthesizer = Synthesizer.load(settings)
    info = synthesizer.model.info
    slots = synthesizer.engine.runner.slots
    device = synthesizer.model.device
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    seconds = arguments.seconds
    workload = standard_requests(arguments.jobs, seed=WORKLOAD_SEED, seconds=seconds)
    warm_up = standard_requests(min(arguments.jobs, WARM_UP_JOBS), seed=WARM_UP_SEED, seconds=seconds)
    mean = (seconds[0] + seconds[1]) / 2
    alone = standard_requests(1, seed=WORKLOAD_SEED, seconds=(mean, mean))

    results: list[ModeResult] = []
    soak: list[SoakSample] = []
    progress("engine: warming up")
    synthesize_timed(synthesizer, warm_up)
    synthesize_timed(synthesizer, alone)
    progress("engine: batch 1")
    finished(results, run_engine(synthesizer, "engine, batch 1", alone))
    progress("engine: the workload")
    finished(results, run_engine(synthesizer, "engine alone", workload))
    if arguments.stock and not arguments.skip_stock:
        progress("stock ChatTTS")
        finished(results, run_stock(synthesizer, workload[: arguments.stock]))
    if arguments.soak_s > 0:
        progress(f"engine: soak for {arguments.soak_s:g} s")
        soak_result, soak = run_soak(synthesizer, arguments.jobs, seconds, arguments.soak_s, arguments.soak_every_s)
        finished(results, soak_result)
    # The workers load a model of their own on the same device: free this one first.
    del synthesizer
    free_memory(device)
    if device.type == "cuda":
        progress(f"engine freed: {torch.cuda.memory_reserved(device) / MIB:.0f} MiB still reserved here")
    if not arguments.skip_farm:
        for placement, named in farm_placements(arguments, device):
            jobs = arguments.jobs * (worker_count(placement) if arguments.jobs_per_worker else 1)
            requests = (
                workload if jobs == len(workload) else standard_requests(jobs, seed=WORKLOAD_SEED, seconds=seconds)
            )
            for processes in [int(count) for count in arguments.celery_processes.split(",")]:
                finished(results, run_farm(arguments, warm_up, requests, placement, processes, named))

    print(
        f"\nmodel {info.source} ({info.kind}, {info.scale or 'real'}), device {info.device} ({gpu}), "
        f"GPT dtype {info.dtype}, torch {torch.__version__}; {arguments.jobs} jobs of {seconds[0]:g}-{seconds[1]:g} s "
        f"of speech, {sum(expected_tokens(r.text, r.speed) for r in workload) / max(len(workload), 1):.0f} "
        f"tokens a job on average, {slots} slots, KV cache {arguments.kv_dtype}\n"
    )
    print_tables(results, soak)
    print_scaling(results)
    if arguments.json:
        with open(arguments.json, "w") as handle:
            json.dump(
                {
                    "model": info.as_dict(),
                    "gpu": gpu,
                    "torch": torch.__version__,
                    "arguments": {k: v for k, v in vars(arguments).items() if k != "json"},
                    "results": [r.as_dict() for r in results],
                    "soak": [asdict(s) for s in soak],
                },
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()
