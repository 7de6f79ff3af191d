"""Probes and Prometheus: /healthz, /readyz and /metrics.

Worker and queue figures come from Redis (see web.farm_state); job figures come from the database.
"""

from __future__ import annotations

import logging

from flask import Blueprint, Response, current_app
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from redis.exceptions import RedisError
from sqlalchemy import func

from chattts_farm import backlog
from chattts_farm.contract import queue_of_worker
from web import backends, farm_state
from web.models import Job, JobStatus, db

logger = logging.getLogger(__name__)

bp = Blueprint("monitoring", __name__)

# Latency histograms are computed over the most recent finished jobs.
HISTOGRAM_JOBS = 10_000
WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
SYNTHESIS_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900)
JOB_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
FIRST_CHUNK_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30)


@bp.get("/healthz")
def healthz():
    return {"status": "ok"}


@bp.get("/readyz")
def readyz():
    """Ready when Redis answers, at least one worker is alive and the queue takes more jobs; says which
    model the workers run and how many jobs wait against the cap."""
    try:
        backends.current().redis.ping()
        alive = farm_state.workers()
        queue = _backlog()
    except RedisError as error:
        # The probe is open to anyone: the connection's details (hosts, ports) go to the log only.
        logger.warning("not ready: Redis could not be reached: %s", error)
        return {"ready": False, "redis": False, "error": "Redis could not be reached", "workers": 0}, 503
    ready = bool(alive) and queue.accepting
    body = {
        "ready": ready,
        "redis": True,
        "workers": len(alive),
        "models": sorted({report["model"] for report in alive}),
        "queue": {"waiting": queue.waiting, "max_queued_jobs": queue.max_queued_jobs, "accepting": queue.accepting},
    }
    return body, 200 if ready else 503


def _backlog() -> backlog.Backlog:
    return backlog.read_backlog(
        client=backends.current().redis, max_queued_jobs=current_app.config["SETTINGS"].max_queued_jobs
    )


@bp.get("/metrics")
def metrics():
    registry = CollectorRegistry()
    registry.register(_FarmCollector())
    return Response(generate_latest(registry), mimetype="text/plain; version=0.0.4")


class _FarmCollector:
    """Computes every metric at scrape time, so any web process answers with the whole farm's figures."""

    def collect(self):
        counts = dict(db.session.execute(db.select(Job.status, func.count()).group_by(Job.status)).all())
        jobs = GaugeMetricFamily("chattts_jobs", "Jobs by status", labels=["status"])
        for status in JobStatus.ALL:
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs

        audio = db.session.execute(
            db.select(func.coalesce(func.sum(Job.duration_s), 0.0)).where(Job.status == JobStatus.DONE)
        ).scalar_one()
        yield CounterMetricFamily("chattts_audio_seconds", "Seconds of audio produced", value=float(audio))

        recent = db.session.execute(
            db.select(Job.created_at, Job.result)
            .where(Job.status == JobStatus.DONE)
            .order_by(Job.finished_at.desc())
            .limit(HISTOGRAM_JOBS)
        ).all()
        pickups, waits, synthesis, whole, first_chunks = [], [], [], [], []
        for created_at, result in recent:
            if result and result.get("started_at") and result.get("finished_at"):
                submitted = created_at.timestamp()
                wait = max(0.0, result["started_at"] - submitted)
                waits.append(wait)
                if result.get("received_at"):  # none in the results of workers older than it
                    pickups.append(max(0.0, result["received_at"] - submitted))
                synthesis.append(max(0.0, result["finished_at"] - result["started_at"]))
                whole.append(max(0.0, result["finished_at"] - submitted))
                first_chunk = (result.get("timings") or {}).get("first_chunk_s")
                if first_chunk is not None:
                    first_chunks.append(wait + first_chunk)
        yield _histogram(
            "chattts_worker_pickup_seconds", "From submission to a worker's taking the job", pickups, WAIT_BUCKETS
        )
        yield _histogram("chattts_queue_wait_seconds", "From submission to the start of synthesis", waits, WAIT_BUCKETS)
        yield _histogram(
            "chattts_synthesis_seconds", "From the start of synthesis to the result", synthesis, SYNTHESIS_BUCKETS
        )
        yield _histogram("chattts_job_seconds", "From submission to the result", whole, JOB_BUCKETS)
        yield _histogram(
            "chattts_first_chunk_seconds",
            "From submission to a streamed job's first audio",
            first_chunks,
            FIRST_CHUNK_BUCKETS,
        )

        try:
            alive = farm_state.workers()
            depths = farm_state.queue_depths(alive)
            queue = _backlog()
        except RedisError:
            alive, depths, queue = [], {}, None
        queues = GaugeMetricFamily("chattts_queue_depth", "Jobs waiting in each queue", labels=["queue"])
        for name, depth in depths.items():
            queues.add_metric([name], depth)
        yield queues
        if queue is not None:
            yield GaugeMetricFamily(
                "chattts_jobs_waiting", "Jobs accepted, not yet started (what the cap counts)", value=queue.waiting
            )
            yield GaugeMetricFamily(
                "chattts_max_queued_jobs", "Jobs waiting at which submissions stop", value=queue.max_queued_jobs
            )
        yield GaugeMetricFamily("chattts_workers_online", "Workers with a fresh heartbeat", value=len(alive))
        batch = GaugeMetricFamily(
            "chattts_worker_batch_size",
            "Jobs in the batch a worker runs now (last: last batch)",
            labels=["worker", "which"],
        )
        peak = GaugeMetricFamily(
            "chattts_gpu_peak_allocated_bytes", "Peak GPU memory allocated", labels=["worker", "gpu"]
        )
        fragmentation = GaugeMetricFamily(
            "chattts_gpu_fragmentation_ratio", "1 - allocated / reserved GPU memory", labels=["worker", "gpu"]
        )
        allocated = GaugeMetricFamily("chattts_gpu_allocated_bytes", "GPU memory allocated", labels=["worker", "gpu"])
        reserved = GaugeMetricFamily(
            "chattts_gpu_reserved_bytes", "GPU memory reserved by the allocator", labels=["worker", "gpu"]
        )
        utilisation = GaugeMetricFamily(
            "chattts_gpu_utilisation_ratio", "Share of time the GPU was busy (NVML)", labels=["worker", "gpu"]
        )
        # Counted by each worker process since it started: rate() over them is the farm's throughput,
        # and Prometheus reads a restarted worker's drop to zero as a counter reset.
        jobs_done = CounterMetricFamily("chattts_worker_jobs_done", "Jobs a worker has finished", labels=["worker"])
        audio_done = CounterMetricFamily(
            "chattts_worker_audio_seconds", "Seconds of audio a worker has produced", labels=["worker"]
        )
        # A GPU's engine process counts what its quality gates did, since it started.
        gates = {
            "asr_checks": CounterMetricFamily(
                "chattts_engine_asr_checks", "Segment attempts the ASR gate heard", labels=["worker"]
            ),
            "asr_mismatches": CounterMetricFamily(
                "chattts_engine_asr_mismatches", "Segment attempts heard saying something else", labels=["worker"]
            ),
            "regenerated": CounterMetricFamily(
                "chattts_engine_segments_regenerated",
                "Segments generated again with another seed by a quality gate",
                labels=["worker"],
            ),
        }
        # Its engine's thread: in the synthesizer's calls, and of that waiting for the GPU (the rest is
        # host work; a thread busy without waiting is the worker's limit, not its GPU), and making pinned
        # host memory, a part of that host work.
        engine_thread = CounterMetricFamily(
            "chattts_engine_thread_seconds",
            "Seconds a GPU's engine thread spent in steps (what: steps) and of those waiting for the GPU "
            "(what: waiting_for_device) and making pinned host memory (what: making_pinned_memory)",
            labels=["worker", "what"],
        )
        # And how its memory caches grew: blocks that had to be made rather than taken from a cache. Once
        # a worker is warm these stay flat; a rise beside a slow level says where its host time went.
        blocks_made = CounterMetricFamily(
            "chattts_engine_memory_blocks_made",
            "Blocks a GPU's engine made rather than reused, of pinned host memory (memory: pinned) and of "
            "device memory (memory: device)",
            labels=["worker", "memory"],
        )
        for report in alive:
            worker = report["worker"]
            jobs_done.add_metric([worker], report["jobs_done"])
            audio_done.add_metric([worker], report.get("audio_seconds_done", 0.0))
            # Every Celery process of a GPU reports its engine's batch and GPU: each counted once, from
            # the first (gpu0@host, not gpu0.1@host).
            if queue_of_worker(worker) != worker.split("@")[0]:
                continue
            batch.add_metric([worker, "current"], report["current_batch"])
            for name, family in gates.items():
                family.add_metric([worker], report.get(name, 0))
            batch.add_metric([worker, "last"], report.get("last_batch_size", 0))
            engine_thread.add_metric([worker, "steps"], report.get("in_steps_s", 0.0))
            engine_thread.add_metric([worker, "waiting_for_device"], report.get("waiting_for_device_s", 0.0))
            engine_thread.add_metric([worker, "making_pinned_memory"], report.get("pinned_alloc_s", 0.0))
            blocks_made.add_metric([worker, "pinned"], report.get("pinned_blocks_made", 0))
            blocks_made.add_metric([worker, "device"], report.get("device_blocks_made", 0))
            if report.get("gpu"):
                gpu = report["gpu"]
                labels = [worker, gpu["name"]]
                peak.add_metric(labels, gpu["peak_allocated_mb"] * 2**20)
                fragmentation.add_metric(labels, gpu["fragmentation"])
                allocated.add_metric(labels, gpu["allocated_mb"] * 2**20)
                reserved.add_metric(labels, gpu["reserved_mb"] * 2**20)
                if gpu.get("utilisation") is not None:
                    utilisation.add_metric(labels, gpu["utilisation"])
        yield from (batch, peak, fragmentation, allocated, reserved, utilisation, jobs_done, audio_done, engine_thread)
        yield blocks_made
        yield from gates.values()


def _histogram(name: str, documentation: str, values: list[float], buckets: tuple[float, ...]) -> HistogramMetricFamily:
    cumulative = [[str(bound), sum(1 for v in values if v <= bound)] for bound in buckets]
    cumulative.append(["+Inf", len(values)])
    return HistogramMetricFamily(name, documentation, buckets=cumulative, sum_value=sum(values))
