"""bench/in_turn.py: one command run on several trees and settings in turn, within a time budget, each
run's log kept and its figures gathered in one table."""

import subprocess
import sys
import tarfile
import time
from pathlib import Path

from tests.support import markdown_table

REPOSITORY = Path(__file__).resolve().parents[2]


def in_turn(*arguments: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.in_turn", *arguments],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def tree_with_probe(folder: Path, says: str, *, sleeps_s: float = 0) -> Path:
    """A tree whose module ``probe`` prints what tree it is and the setting PROBE_SETTING."""
    folder.mkdir()
    (folder / "probe.py").write_text(
        "import os, time\n"
        f"time.sleep({sleeps_s})\n"
        f"print('figure: {says}, setting', os.environ.get('PROBE_SETTING'))\n"
        "print('noise the table leaves out')\n"
    )
    return folder


def final_table(stdout: str) -> list[dict[str, str]]:
    lines = stdout.splitlines()
    last_header = max(i for i, line in enumerate(lines) if line.startswith("| run |"))
    return markdown_table(lines[last_header:], "| run |")


def test_runs_go_in_turn_each_from_its_own_tree_with_its_own_settings(tmp_path):
    tree_a = tree_with_probe(tmp_path / "a", "tree a")
    with tarfile.open(tmp_path / "b.tar", "w") as archive:
        archive.add(tree_with_probe(tmp_path / "b", "tree b") / "probe.py", arcname="probe.py")
    out = tmp_path / "out"

    finished = in_turn(
        *(f"a@{tree_a}:PROBE_SETTING=1", f"b@{tmp_path / 'b.tar'}", f"a@{tree_a}:PROBE_SETTING=2,OTHER=x"),
        *("--out", str(out), "--keep", "^figure"),
        *("--", "-m", "probe"),
    )

    assert finished.returncode == 0, finished.stderr
    rows = final_table(finished.stdout)
    assert [(row["name"], row["tree"], row["settings"], row["exit"]) for row in rows] == [
        ("a", "a", "PROBE_SETTING=1", "0"),
        ("b", "b.tar", "", "0"),
        ("a", "a", "PROBE_SETTING=2 OTHER=x", "0"),
    ]
    assert [row["figures"] for row in rows] == [
        "figure: tree a, setting 1",
        "figure: tree b, setting None",
        "figure: tree a, setting 2",
    ]
    # Each run's whole output is kept, numbered in the order they ran.
    assert sorted(path.name for path in out.iterdir()) == ["1-a.log", "2-b.log", "3-a.log"]
    assert "noise the table leaves out" in (out / "2-b.log").read_text()


def test_a_run_past_the_budget_is_stopped_and_the_runs_after_it_are_skipped(tmp_path):
    slow = tree_with_probe(tmp_path / "slow", "slow", sleeps_s=60)
    started = time.monotonic()

    finished = in_turn(
        *(f"slow@{slow}", f"never@{slow}"),
        *("--budget-s", "3", "--min-run-s", "1", "--out", str(tmp_path / "out")),
        *("--", "-m", "probe"),
    )

    assert finished.returncode == 0, finished.stderr
    assert time.monotonic() - started < 30
    assert [(row["name"], row["exit"]) for row in final_table(finished.stdout)] == [
        ("slow", "stopped"),
        ("never", "skipped"),
    ]


def test_a_run_that_fails_shows_its_exit_status_and_the_next_still_runs(tmp_path):
    tree = tree_with_probe(tmp_path / "t", "t")
    (tree / "broken.py").write_text("raise SystemExit(3)\n")

    finished = in_turn(f"x@{tree}", f"y@{tree}", "--out", str(tmp_path / "out"), "--", "-m", "broken")

    assert [(row["name"], row["exit"]) for row in final_table(finished.stdout)] == [("x", "3"), ("y", "3")]


def test_a_malformed_run_is_refused_naming_it(tmp_path):
    finished = in_turn("fp8:CHATTTS_FARM_MATMUL_DTYPE", "--", "-m", "probe")

    assert finished.returncode == 2
    assert "run 'fp8:CHATTTS_FARM_MATMUL_DTYPE': 'CHATTTS_FARM_MATMUL_DTYPE' is not VAR=VALUE" in finished.stderr


def test_without_a_command_nothing_runs_and_the_usage_says_what_is_missing():
    finished = in_turn("main")

    assert finished.returncode != 0
    assert "PYTHON-ARGUMENTS" in finished.stderr


def tree_with_figure(folder: Path) -> Path:
    """A tree whose module ``valued`` prints the figure PROBE_VALUE names (with a thousands separator, as
    the benches print theirs), or nothing without it."""
    folder.mkdir()
    (folder / "valued.py").write_text(
        "import os\nvalue = os.environ.get('PROBE_VALUE')\n"
        "if value:\n    print(f'  1,536 jobs: {float(value):,} a second')\n"
    )
    return folder


def test_the_summary_sets_each_names_runs_against_the_baseline_name(tmp_path):
    tree = tree_with_figure(tmp_path / "t")

    finished = in_turn(
        *(f"main@{tree}:PROBE_VALUE=1000", f"change@{tree}:PROBE_VALUE=1250.5", f"main@{tree}:PROBE_VALUE=1400"),
        f"silent@{tree}",
        *("--figure", r"rate=jobs: ([\d,.]+) a second", "--out", str(tmp_path / "out")),
        *("--", "-m", "valued"),
    )

    assert finished.returncode == 0, finished.stderr
    rows = markdown_table(finished.stdout.splitlines(), "| figure |")
    # A name runs again to show its spread; a run whose log holds no such figure adds no row.
    assert [(row["name"], row["runs"], row["mean"], row["least"], row["most"]) for row in rows] == [
        ("main", "2", "1,200", "1,000", "1,400"),
        ("change", "1", "1,250.5", "1,250.5", "1,250.5"),
    ]
    assert [row["mean against main"] for row in rows] == ["", "+4.2%"]
    assert {row["figure"] for row in rows} == {"rate"}


def test_by_default_the_summary_reads_the_engine_s_untimed_rate_and_its_vocoder_s_seconds(tmp_path):
    tree = tmp_path / "t"
    tree.mkdir()
    # Two lines as bench.engine_phases prints them.
    (tree / "phases.py").write_text(
        "print('  1536 jobs: 5.83 s, 2682.7 audio-s per wall-s (phases untimed)')\n"
        "print('  | vocoder | 0.55 | 63 | 8.74 |')\n"
    )

    finished = in_turn(f"main@{tree}", "--out", str(tmp_path / "out"), "--", "-m", "phases")

    rows = markdown_table(finished.stdout.splitlines(), "| figure |")
    assert [(row["figure"], row["mean"]) for row in rows] == [("untimed audio-s/s", "2,682.7"), ("vocoder s", "0.55")]


def test_a_figure_without_one_group_for_its_number_is_refused_naming_it(tmp_path):
    finished = in_turn("main", "--figure", "rate=jobs: [0-9]+", "--", "-m", "probe")

    assert finished.returncode == 2
    assert "figure 'rate=jobs: [0-9]+': its regex needs one group, the number" in finished.stderr
