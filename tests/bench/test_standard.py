"""bench/standard.py in a tiny form: every mode of the standard workload runs on the CPU and finishes every job."""

import re

from tests.support import markdown_table, run_bench

MODES = ("engine, batch 1", "engine alone", "stock ChatTTS, serial", "engine soak", "farm (Redis + Celery)")


def test_every_mode_runs_side_by_side_and_finishes_every_job(tiny_assets, data_dir, tmp_path):
    finished = run_bench(
        "standard",
        *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "6", "--stock", "1"),
        *("--soak-s", "3", "--soak-every-s", "1", "--seconds", "1-2", "--workdir", str(tmp_path)),
        *("--py-spy", str(tmp_path / "py-spy")),
        data_dir=data_dir,
    )
    lines = finished.stdout.splitlines()

    modes = markdown_table(lines, "| mode |")
    assert [row["mode"] for row in modes] == list(MODES)
    for row in modes:
        assert float(row["audio-s/s"]) > 0, row
        assert row["done"] == row["jobs"], row
        assert row["peak alloc MiB"] == row["fragmentation"] == row["segments"] == "-", row  # no CUDA here
    assert modes[1]["jobs"] == modes[4]["jobs"] == "6"
    assert any(line.startswith("batch 1: RTF ") for line in lines)
    [cpu] = [line for line in lines if line.startswith("farm (Redis + Celery): CPU a job")]
    celery_ms, encoders_ms, engine_ms = (float(figure) for figure in re.findall(r"([\d.]+) ms", cpu))
    assert celery_ms > 0 and engine_ms > 0 and encoders_ms >= 0  # the workload's wav needs no encoder
    # The engine alone's process, for comparison with the farm's engine process.
    [alone] = [line for line in lines if line.startswith("engine alone: CPU a job in its process")]
    assert float(re.search(r"([\d.]+) ms", alone)[1]) > 0

    # The farm's latency split at the times its jobs' results tell: each part within the jobs' latency.
    [hops] = markdown_table(lines, "| farm run |")
    assert hops["farm run"] == "farm (Redis + Celery)"
    parts = [[float(figure) for figure in cell.split(" / ")] for cell in list(hops.values())[1:]]
    assert len(parts) == 5
    for p50, p95 in parts:
        assert -0.01 <= p50 <= p95 <= float(modes[4]["p95 latency s"]) + 0.05, hops
    assert parts[2][0] > 0  # the engine's own time

    # With --py-spy, where each of the farm's worker processes' threads were over its workload: the engine
    # process's batcher in one, the Celery processes' job threads (one row for the pool) in the others.
    title = "where a worker process's threads were over farm (Redis + Celery)'s workload (py-spy):"
    starts = [index for index, line in enumerate(lines) if line == title]
    assert len(starts) >= 2  # the engine process and at least one Celery process
    threads = [
        {row["thread"]: int(row["samples"]) for row in markdown_table(lines[start:], "| thread |")} for start in starts
    ]
    assert sum(1 for sampled in threads if sampled.get("batcher", 0) > 0) == 1, threads
    celery = [sampled for sampled in threads if "batcher" not in sampled]
    assert celery and all(sampled.get("ThreadPoolExecutor-0_*", 0) > 0 for sampled in celery), threads

    soak = markdown_table(lines, "| t s |")
    assert len(soak) >= 2
    assert sum(float(row["audio-s/s"]) for row in soak[1:]) > 0

    # Each mode's figures also went to stderr as it ended, so a run cut off later still shows them.
    headlines = [line.split("] ", 1)[1] for line in finished.stderr.splitlines() if " audio-s/s, latency p50 " in line]
    assert [line.split(":", 1)[0] for line in headlines] == list(MODES)
    for line, row in zip(headlines, modes, strict=True):
        assert f"{row['done']} of {row['jobs']} jobs" in line and f", {row['audio-s/s']} audio-s/s" in line, line
    # A hop can be -0.00: a sender notes a job's send once its message has gone, and the engine may have begun it.
    assert re.search(r"; submit -> engine starts p50 -?[\d.]+ s, p95 -?[\d.]+ s$", headlines[4]), headlines[4]


def test_farm_runs_on_several_workers_carry_the_load_of_one_each_and_are_compared_with_one(
    tiny_assets, data_dir, tmp_path
):
    # Two CPU workers stand in for two GPUs: the comparison is what is checked here, not its figure.
    finished = run_bench(
        "standard",
        *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "2", "--skip-stock", "--seconds", "1-1"),
        *("--farm-cpus", "1", "--farm-cpus", "2", "--jobs-per-worker", "--workdir", str(tmp_path)),
        data_dir=data_dir,
    )
    lines = finished.stdout.splitlines()

    farms = [row for row in markdown_table(lines, "| mode |") if row["mode"].startswith("farm")]
    assert [(row["mode"], row["jobs"], row["done"]) for row in farms] == [
        ("farm (Redis + Celery), 1 CPU worker", "2", "2"),
        ("farm (Redis + Celery), 2 CPU workers", "4", "4"),
    ]
    [scaling] = [line for line in lines if " x the audio-s/s of " in line]
    multiple = float(re.search(r": ([\d.]+) x the audio-s/s of farm \(Redis \+ Celery\), 1 CPU worker", scaling)[1])
    # The table rounds each audio-s/s to 0.1 and the line its multiple to 0.01: the multiple of the unrounded
    # figures lies within what the rounded ones allow.
    one, two = (float(row["audio-s/s"]) for row in farms)
    assert (two - 0.05) / (one + 0.05) - 0.005 <= multiple <= (two + 0.05) / (one - 0.05) + 0.005
    assert "(4 jobs against 2); p95 latency" in scaling
