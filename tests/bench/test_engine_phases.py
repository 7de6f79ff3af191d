"""bench/engine_phases.py in a tiny form: every phase of the synthesizer is timed and the decode step alone too."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_phases_of_a_workload_are_timed_on_the_cpu(tiny_assets, data_dir):
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.engine_phases",
            *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "6", "--slots", "4"),
            *("--kv-dtypes", "model,fp8", "--seconds", "1-2"),
        ],
        cwd=ROOT,
        env={**os.environ, "CHATTTS_FARM_DATA_DIR": str(data_dir)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
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
