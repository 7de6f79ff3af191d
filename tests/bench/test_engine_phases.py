"""bench/engine_phases.py in a tiny form: every phase of the synthesizer is timed and the decode step alone too."""

from tests.support import run_bench


def test_the_phases_of_a_workload_are_timed_on_the_cpu(tiny_assets, data_dir):
    finished = run_bench(
        "engine_phases",
        *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "4", "--slots", "4"),
        *("--kv-dtypes", "model,fp8", "--seconds", "1-2"),
        data_dir=data_dir,
        timeout_s=300,
    )
    output = finished.stdout
    assert output.count("audio-s per wall-s (phases timed)") == 2  # both cache dtypes
    phases = {
        line.split("|")[1].strip(): float(line.split("|")[2])
        for line in output.splitlines()
        if line.startswith("  | ") and "---" not in line and "phase" not in line
    }
    assert {"prefill", "decode step", "vocoder", "finish"} <= set(phases)
    assert phases["decode step"] > 0 and phases["vocoder"] > 0
    assert "decode step of 4 slot(s)" in output
