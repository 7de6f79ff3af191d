"""The probes (what /readyz says when the farm is not ready) and /metrics against the Grafana dashboard."""

import dataclasses
import json
import re
import time
import uuid
from datetime import timedelta
from pathlib import Path

import redis
from prometheus_client.parser import text_string_to_metric_families

from chattts_farm import redis_keys
from web import create_app
from web.models import Job, JobStatus, db, utcnow

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/monitoring/grafana/dashboards/chattts-farm.json"


def test_readyz_says_redis_is_unreachable_without_the_connection_details(tiny_settings, tmp_path):
    settings = dataclasses.replace(tiny_settings, redis_url="redis://127.0.0.1:1/0", data_dir=tmp_path)
    answer = create_app({"TESTING": True, "SETTINGS": settings}).test_client().get("/readyz")
    assert answer.status_code == 503
    assert answer.get_json() == {"ready": False, "redis": False, "error": "Redis could not be reached", "workers": 0}


# PromQL's words that are not metric names: functions, aggregations and their modifiers.
PROMQL_WORDS = {"sum", "rate", "histogram_quantile", "by", "le", "irate", "avg", "max", "min", "increase", "without"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
A_GPU_WORKER = {
    "worker": "gpu0@host",
    "model": "synthetic",
    "model_info": {"kind": "synthetic"},
    "current_batch": 3,
    "last_batch_size": 8,
    "jobs_done": 12,
    "audio_seconds_done": 120.5,
    "asr_checks": 40,
    "asr_mismatches": 6,
    "regenerated": 7,
    "in_steps_s": 30.5,
    "waiting_for_device_s": 12.25,
    "pinned_alloc_s": 1.5,
    "pinned_blocks_made": 30,
    "device_blocks_made": 4,
    "gpu": {
        "name": "NVIDIA H200",
        "allocated_mb": 1000.0,
        "reserved_mb": 1200.0,
        "peak_allocated_mb": 1100.0,
        "fragmentation": 0.1667,
        "utilisation": 0.93,
    },
}


def metric_names(expression: str) -> set[str]:
    without_labels = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expression)
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_labels)) - PROMQL_WORDS
    return {word for word in words if not re.fullmatch(r"[0-9.]+", word)}


def exported_families(metrics_text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+)", metrics_text, re.MULTILINE))


def test_every_metric_the_dashboard_queries_is_one_the_web_exports(client, redis_url):
    # A GPU worker's heartbeats, as its Celery processes write them (none runs here), so per-GPU
    # metrics appear: the GPU's second Celery process reports the same engine, counted once.
    for report in (A_GPU_WORKER, {**A_GPU_WORKER, "worker": "gpu0.1@host", "jobs_done": 5}):
        report = {**report, "heartbeat": time.time()}
        redis.Redis.from_url(redis_url).set(redis_keys.heartbeat(report["worker"]), json.dumps(report), ex=30)
    metrics = client.get("/metrics").get_data(as_text=True)
    exported = exported_families(metrics)
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
    }
    gpu = (("gpu", "NVIDIA H200"), ("worker", "gpu0@host"))
    assert samples["chattts_gpu_utilisation_ratio", gpu] == 0.93
    assert samples["chattts_gpu_reserved_bytes", gpu] == 1200 * 2**20
    assert samples["chattts_worker_audio_seconds_total", (("worker", "gpu0@host"),)] == 120.5
    assert samples["chattts_worker_jobs_done_total", (("worker", "gpu0.1@host"),)] == 5
    # What the engine's quality gates did, from the GPU's first Celery process alone.
    first = (("worker", "gpu0@host"),)
    assert samples["chattts_engine_asr_checks_total", first] == 40
    assert samples["chattts_engine_asr_mismatches_total", first] == 6
    assert samples["chattts_engine_segments_regenerated_total", first] == 7
    assert ("chattts_engine_asr_checks_total", (("worker", "gpu0.1@host"),)) not in samples
    # Its engine's thread: in steps, and of that waiting for the GPU and making pinned memory.
    thread = "chattts_engine_thread_seconds_total"
    assert samples[thread, (("what", "steps"), ("worker", "gpu0@host"))] == 30.5
    assert samples[thread, (("what", "waiting_for_device"), ("worker", "gpu0@host"))] == 12.25
    assert samples[thread, (("what", "making_pinned_memory"), ("worker", "gpu0@host"))] == 1.5
    assert not [key for key in samples if key[0] == thread and ("worker", "gpu0.1@host") in key[1]]
    # And the blocks its memory caches had to make.
    made = "chattts_engine_memory_blocks_made_total"
    assert samples[made, (("memory", "pinned"), ("worker", "gpu0@host"))] == 30
    assert samples[made, (("memory", "device"), ("worker", "gpu0@host"))] == 4
    assert not [key for key in samples if key[0] == made and ("worker", "gpu0.1@host") in key[1]]
    assert not [key for key in samples if key[0].startswith("chattts_gpu_") and ("worker", "gpu0.1@host") in key[1]]
    assert ("chattts_worker_batch_size", (("which", "current"), ("worker", "gpu0.1@host"))) not in samples

    queried = {
        name
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for target in panel["targets"]
        for name in metric_names(target["expr"])
    }
    assert queried, "the dashboard queries nothing"
    for name in queried:
        family = name.removesuffix("_total")
        for suffix in HISTOGRAM_SUFFIXES:
            family = family.removesuffix(suffix)
        assert family in exported or name in exported, f"the dashboard queries {name}, which /metrics lacks"


def test_a_jobs_wait_is_split_at_the_worker_that_took_it_in_metrics_and_status(app, client):
    created = utcnow() - timedelta(minutes=1)
    submitted = created.timestamp()
    taken, older = str(uuid.uuid4()), str(uuid.uuid4())
    with app.app_context():
        for job_id, result in (
            (taken, {"received_at": submitted + 0.3, "started_at": submitted + 4, "finished_at": submitted + 9}),
            # From a worker older than received_at: its wait is counted whole, its pickup not at all.
            (older, {"started_at": submitted + 2, "finished_at": submitted + 3}),
        ):
            db.session.add(
                Job(
                    id=job_id,
                    text="Hi.",
                    parameters={},
                    format="wav",
                    status=JobStatus.DONE,
                    created_at=created,
                    finished_at=utcnow(),
                    result={**result, "sample_rate": 24_000},
                )
            )
        db.session.commit()
    metrics = client.get("/metrics").get_data(as_text=True)
    samples = {
        (sample.name, sample.labels.get("le")): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
    }
    assert samples["chattts_worker_pickup_seconds_count", None] == 1
    assert samples["chattts_worker_pickup_seconds_bucket", "0.1"] == 0
    assert samples["chattts_worker_pickup_seconds_bucket", "0.5"] == 1
    assert samples["chattts_queue_wait_seconds_count", None] == 2
    assert samples["chattts_queue_wait_seconds_bucket", "2"] == 1
    assert samples["chattts_queue_wait_seconds_bucket", "5"] == 2

    shown = client.get(f"/api/jobs/{taken}").get_json()["result"]
    assert shown["received_at"] < shown["started_at"]  # ISO 8601 in UTC, which sorts as time does
    assert client.get(f"/api/jobs/{older}").get_json()["result"]["received_at"] is None
