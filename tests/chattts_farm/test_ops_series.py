"""The farm's recent history, as workers write it to Redis and the ops page reads it back."""

import redis

from chattts_farm import redis_keys
from chattts_farm.ops_series import SAMPLE_INTERVAL_S, SAMPLES_KEPT, WINDOW_S, Sample, fold, percentile, read, record

NOW = 1_800_000_000.0


def test_a_workers_history_keeps_the_last_window_and_expires_with_the_worker(idle_redis_url):
    client = redis.Redis.from_url(idle_redis_url)
    for index in range(SAMPLES_KEPT + 10):
        record(client, "gpu0@host", Sample(at=NOW + index * SAMPLE_INTERVAL_S, jobs=index))

    key = redis_keys.ops_series("gpu0@host")
    assert client.llen(key) == SAMPLES_KEPT
    assert 0 < client.ttl(key) <= WINDOW_S
    series = read(client, NOW + (SAMPLES_KEPT + 9) * SAMPLE_INTERVAL_S)
    assert series["jobs_per_s"][-1] == (SAMPLES_KEPT + 9) / SAMPLE_INTERVAL_S
    assert series["jobs_per_s"][0] == 10 / SAMPLE_INTERVAL_S  # the ten oldest were trimmed


def test_workers_add_up_on_one_time_axis_and_unmeasured_points_stay_empty():
    histories = {
        "gpu0@a": [Sample(at=NOW - 0.5, jobs=2, audio_s=20.0, queues={"chattts": 5})],
        "gpu1@b": [Sample(at=NOW - 1.0, jobs=1, audio_s=4.0, queues={"gpu1": 1})],
    }

    series = fold(histories, NOW)

    assert len(series["t"]) == WINDOW_S // SAMPLE_INTERVAL_S and series["t"][-1] <= NOW
    assert series["audio_s_per_s"][-1] == 24.0 / SAMPLE_INTERVAL_S
    assert series["jobs_per_s"][-1] == 3 / SAMPLE_INTERVAL_S
    assert series["queues"] == {
        "chattts": [None] * (len(series["t"]) - 1) + [5],
        "gpu1": [None] * (len(series["t"]) - 1) + [1],
    }
    assert series["audio_s_per_s"][:-1] == [None] * (len(series["t"]) - 1)
    assert series["gpus"] == {}  # CPU workers report no GPU


def test_latency_percentiles_cover_the_minute_before_each_point():
    old = Sample(at=NOW - 120, latencies_s=[100.0])  # two minutes back: out of the last point's minute
    recent = [Sample(at=NOW - 50 + index, latencies_s=[float(index + 1)]) for index in range(20)]
    streamed = Sample(at=NOW - 1, first_chunks_s=[0.2, 0.4])

    series = fold({"cpu0@a": [old, *recent, streamed]}, NOW)

    assert series["latency"]["p50_s"][-1] == 10.0
    assert series["latency"]["p95_s"][-1] == 19.0
    assert series["first_chunk"]["p50_s"][-1] == 0.2 and series["first_chunk"]["p95_s"][-1] == 0.4
    earliest = series["t"].index(max(t for t in series["t"] if t <= NOW - 120 + SAMPLE_INTERVAL_S))
    assert series["latency"]["p95_s"][earliest] == 100.0


def test_gpu_samples_become_one_series_per_worker():
    gpu = {"allocated_mb": 900.0, "reserved_mb": 1000.0, "fragmentation": 0.1, "utilisation": None}

    series = fold({"gpu0@a": [Sample(at=NOW, gpu=gpu)]}, NOW)

    assert {name: values[-1] for name, values in series["gpus"]["gpu0@a"].items()} == gpu


def test_percentile_is_the_nearest_rank():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.95) == 4.0
    assert percentile([7.0], 0.95) == 7.0
