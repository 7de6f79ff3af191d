"""The farm's recent history for the ops page's charts: samples that workers write next to their
heartbeat, and the web's view of them as aligned series.

Each worker appends one sample with every heartbeat (``SAMPLE_INTERVAL_S``) to a capped Redis list of its own (the
newest ``SAMPLES_KEPT``, i.e. the last ``WINDOW_S``, expiring with the worker): what it finished since
the sample before (jobs, audio seconds, each job's latency and first-chunk latency), its GPU's memory
and utilisation, and the depth of the queues it takes jobs from. The web reads every worker's list
and folds them into one time axis of ``SAMPLE_INTERVAL_S`` steps. A sample is ~300 bytes, so a
worker's history holds ~135 KB of Redis at most.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from chattts_farm import redis_keys

SAMPLE_INTERVAL_S = redis_keys.HEARTBEAT_INTERVAL_S
WINDOW_S = 15 * 60
SAMPLES_KEPT = WINDOW_S // SAMPLE_INTERVAL_S
# Latency percentiles of a point are taken over the jobs finished in the minute before it: a point's own
# two seconds hold too few jobs for a p95.
LATENCY_WINDOW_S = 60


# What a sample keeps of a worker's GPU (its heartbeat's "gpu" report has more).
GPU_FIELDS = ("allocated_mb", "reserved_mb", "fragmentation", "utilisation")


@dataclass
class Sample:
    """What one worker did and saw in one sampling interval."""

    at: float  # Unix time
    jobs: int = 0
    audio_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)  # receipt by the worker -> result
    first_chunks_s: list[float] = field(default_factory=list)  # receipt by the worker -> first streamed audio
    queues: dict[str, int] = field(default_factory=dict)
    gpu: dict | None = None  # allocated_mb, reserved_mb, fragmentation, utilisation (None without NVML)


def record(client, worker: str, sample: Sample) -> None:
    """Append a worker's sample to its history, keeping the last ``WINDOW_S``."""
    key = redis_keys.ops_series(worker)
    pipeline = client.pipeline(transaction=False)
    pipeline.rpush(key, json.dumps(asdict(sample), separators=(",", ":")))
    pipeline.ltrim(key, -SAMPLES_KEPT, -1)
    pipeline.expire(key, WINDOW_S)
    pipeline.execute()


def read(client, now: float, window_s: int = WINDOW_S) -> dict:
    """Every worker's history of the last ``window_s``, as series on one time axis (see :func:`fold`)."""
    keys = sorted(client.scan_iter(match=redis_keys.ops_series("*")))
    pipeline = client.pipeline(transaction=False)
    for key in keys:
        pipeline.lrange(key, 0, -1)
    histories = {}
    for key, raws in zip(keys, pipeline.execute(), strict=True):
        worker = (key.decode() if isinstance(key, bytes) else key).removeprefix(redis_keys.OPS_SERIES_PREFIX)
        histories[worker] = [Sample(**json.loads(raw)) for raw in raws]
    return fold(histories, now, window_s)


def fold(histories: dict[str, list[Sample]], now: float, window_s: int = WINDOW_S) -> dict:
    """Workers' samples as aligned series: ``t`` (Unix seconds, one point per ``SAMPLE_INTERVAL_S``), and
    for each point the farm's audio seconds and jobs per second, each queue's depth, the latency and
    first-chunk latency p50/p95 over the minute before, and each GPU's memory and utilisation. A point
    no sample fell into is None: the charts leave a gap rather than draw a zero nobody measured."""
    points = window_s // SAMPLE_INTERVAL_S
    end = math.floor(now / SAMPLE_INTERVAL_S) * SAMPLE_INTERVAL_S
    times = [end - (points - 1 - index) * SAMPLE_INTERVAL_S for index in range(points)]
    start = times[0] - SAMPLE_INTERVAL_S

    def slot(at: float) -> int | None:
        index = math.ceil((at - start) / SAMPLE_INTERVAL_S) - 1
        return index if 0 <= index < points else None

    audio: list[float | None] = [None] * points
    jobs: list[float | None] = [None] * points
    finished: list[tuple[list[float], list[float]]] = [([], []) for _ in range(points)]
    queues: dict[str, list[int | None]] = {}
    gpus: dict[str, dict[str, list]] = {}
    for worker, samples in histories.items():
        for sample in samples:
            index = slot(sample.at)
            if index is None:
                continue
            audio[index] = (audio[index] or 0.0) + sample.audio_s / SAMPLE_INTERVAL_S
            jobs[index] = (jobs[index] or 0.0) + sample.jobs / SAMPLE_INTERVAL_S
            finished[index][0].extend(sample.latencies_s)
            finished[index][1].extend(sample.first_chunks_s)
            for queue, depth in sample.queues.items():
                queues.setdefault(queue, [None] * points)[index] = depth
            if sample.gpu is not None:
                series = gpus.setdefault(worker, {name: [None] * points for name in GPU_FIELDS})
                for name, values in series.items():
                    values[index] = sample.gpu.get(name)

    span = LATENCY_WINDOW_S // SAMPLE_INTERVAL_S
    latency = {name: [None] * points for name in ("p50_s", "p95_s")}
    first_chunk = {name: [None] * points for name in ("p50_s", "p95_s")}
    for index in range(points):
        recent = finished[max(0, index - span + 1) : index + 1]
        for which, out in ((0, latency), (1, first_chunk)):
            values = sorted(value for point in recent for value in point[which])
            if values:
                out["p50_s"][index] = percentile(values, 0.50)
                out["p95_s"][index] = percentile(values, 0.95)
    return {
        "step_s": SAMPLE_INTERVAL_S,
        "t": times,
        "audio_s_per_s": audio,
        "jobs_per_s": jobs,
        "latency": latency,
        "first_chunk": first_chunk,
        "queues": queues,
        "gpus": gpus,
    }


def percentile(ordered: list[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted values."""
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]
