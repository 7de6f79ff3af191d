"""bench/load.py in a short form: a worker started by `chattts-farm up` on PostgreSQL holds concurrent clients,
and the run reports the memory of the farm's Redis and the size of its audio store."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ten_clients_for_eight_seconds_fail_no_request_and_lose_no_job():
    # On PostgreSQL, the production database: SQLite, the default, is what every other farm test runs on.
    finished = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "load.py"),
            "--clients",
            "10",
            "--seconds",
            "8",
            "--database",
            "postgresql",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr[-3000:]
    header, _, row = finished.stdout.strip().splitlines()[-3:]
    figures = dict(
        zip(
            (cell.strip() for cell in header.strip("|").split("|")),
            (cell.strip() for cell in row.strip("|").split("|")),
            strict=True,
        )
    )
    assert int(figures["jobs accepted"]) >= 10
    assert figures["jobs done"] == figures["jobs accepted"]
    assert figures["failed requests"] == figures["failed jobs"] == figures["lost jobs"] == "0"
    assert 0 < float(figures["Redis used MiB"]) <= float(figures["Redis peak MiB"])
    # The audio went to the file store, not to Redis: each job's WAV is there.
    assert float(figures["audio store MiB"]) > 0
