"""bench/standard.py in a tiny form: every mode of the standard workload runs on the CPU and finishes every job."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("engine, batch 1", "engine alone", "stock ChatTTS, serial", "engine soak", "farm (Redis + Celery)")


def markdown_table(lines: list[str], header_start: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header line starts with ``header_start``, as dicts."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    columns = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(columns, (cell.strip() for cell in line.strip("|").split("|")), strict=True)))
    return rows


def test_every_mode_runs_side_by_side_and_finishes_every_job(tiny_assets, data_dir, tmp_path):
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.standard",
            *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "6", "--stock", "1"),
            *("--soak-s", "5", "--soak-every-s", "1", "--seconds", "1-2", "--workdir", str(tmp_path)),
        ],
        cwd=ROOT,
        # One CPU thread: on a small shared machine torch's spinning threads made the tiny model's
        # steps 10-30x slower under load.
        env={**os.environ, "CHATTTS_FARM_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    lines = finished.stdout.splitlines()

    modes = markdown_table(lines, "| mode |")
    assert [row["mode"] for row in modes] == list(MODES)
    for row in modes:
        assert float(row["audio-s/s"]) > 0, row
        assert row["done"] == row["jobs"], row
        assert row["peak alloc MiB"] == row["fragmentation"] == row["segments"] == "-", row  # no CUDA here
    assert modes[1]["jobs"] == modes[4]["jobs"] == "6"
    assert any(line.startswith("batch 1: RTF ") for line in lines)

    soak = markdown_table(lines, "| t s |")
    assert len(soak) >= 2
    assert sum(float(row["audio-s/s"]) for row in soak[1:]) > 0
