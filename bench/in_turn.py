"""Run one benchmark on several trees and settings in turn, within a time budget: how a change is set
against main on a lent GPU in one call (each call of that machine starts bare, and its spread from call
to call is larger than most changes; docs/performance.md).

    python3 -m bench.in_turn --budget-s 540 --out "$OUT" \\
        main fp8-matmuls:CHATTTS_FARM_MATMUL_DTYPE=fp8 tile32@.whl/tile32.tar main \\
        -- -m bench.engine_phases --model synthetic-full --device cuda --jobs 1536 --kv-dtypes fp8

A run is ``NAME[@TREE][:VAR=VALUE[,VAR=VALUE...]]``. TREE is a folder holding the repository's packages,
or a tar of one (``git archive BRANCH worker bench chattts_farm cli pyproject.toml > tree.tar``), unpacked
once; without it, this repository. Each run is ``python3`` with the arguments after ``--``, started in
its tree with the tree first on PYTHONPATH (what PYTHONPATH held stays after it: a wheelhouse's
``--target``) and its variables set; its output goes to ``OUT/N-NAME.log``. A run starts only while
``--min-run-s`` of the budget is left and is stopped when the budget runs out, so that a call ends
inside its limit with what it measured. The table at the end gives each run's exit, its seconds, and
the lines of its log that match ``--keep`` (by default the figures of ``bench.engine_phases`` and
``bench.decode_step``; a table's bars shown as ``¦``).

A summary follows: for each ``--figure LABEL=REGEX`` (the regex's one group a number, its first match
in each log), each run name's mean, least and most over its runs, and its mean against the
``--baseline`` name's (by default ``bench.engine_phases``' untimed audio-s per wall-s and its vocoder's
GPU seconds, against ``main``). The same name run several times is how one setting's spread shows.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
DEFAULT_KEEP = r"audio-s per wall-s|decode step of \d+ slot|^\| engine-graph"
DEFAULT_FIGURES = (
    r"untimed audio-s/s=([\d,]+\.?\d*) audio-s per wall-s \(phases untimed\)",
    r"vocoder s=^\s*\| vocoder \| ([\d.]+) \|",
)


@dataclass(frozen=True)
class Run:
    name: str
    tree: Path | None = None
    settings: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Run:
        """A run from ``NAME[@TREE][:VAR=VALUE,...]``."""
        head, _, assignments = text.partition(":")
        name, _, tree = head.partition("@")
        settings = {}
        for assignment in filter(None, assignments.split(",")):
            variable, equals, value = assignment.partition("=")
            if not equals or not variable:
                raise argparse.ArgumentTypeError(f"run {text!r}: {assignment!r} is not VAR=VALUE")
            settings[variable] = value
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise argparse.ArgumentTypeError(f"run {text!r}: its name must be letters, digits, '.', '_' or '-'")
        return cls(name, Path(tree) if tree else None, settings)

    def described(self) -> str:
        return " ".join(f"{variable}={value}" for variable, value in self.settings.items())


@dataclass(frozen=True)
class Figure:
    """A number the summary gathers from each run's log: the one group of ``pattern``'s first match."""

    label: str
    pattern: re.Pattern

    @classmethod
    def parse(cls, text: str) -> Figure:
        """A figure from ``LABEL=REGEX``."""
        label, equals, regex = text.partition("=")
        if not equals or not label or not regex:
            raise argparse.ArgumentTypeError(f"figure {text!r} is not LABEL=REGEX")
        try:
            pattern = re.compile(regex, re.MULTILINE)
        except re.error as error:
            raise argparse.ArgumentTypeError(f"figure {text!r}: {error}") from None
        if pattern.groups != 1:
            raise argparse.ArgumentTypeError(f"figure {text!r}: its regex needs one group, the number")
        return cls(label, pattern)

    def value(self, log: str) -> float | None:
        match = self.pattern.search(log)
        if match is None:
            return None
        try:
            return float(match.group(1).replace(",", ""))
        except ValueError:
            return None


@dataclass
class Outcome:
    run: Run
    status: str  # the exit status, "stopped" at the budget, or "skipped"
    seconds: float = 0.0
    figures: list[str] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)  # by figure label, those its log holds


class Trees:
    """Each run's folder: this repository, a folder as given, or a tar unpacked once into ``root``."""

    def __init__(self, root: Path):
        self.root = root
        self._unpacked: dict[Path, Path] = {}

    def folder(self, tree: Path | None) -> Path:
        if tree is None:
            return REPOSITORY
        if tree.is_dir():
            return tree.resolve()
        tree = tree.resolve()
        if tree not in self._unpacked:
            folder = self.root / f"{len(self._unpacked)}-{tree.name.split('.')[0]}"
            with tarfile.open(tree) as archive:
                archive.extractall(folder, filter="data")
            self._unpacked[tree] = folder
        return self._unpacked[tree]


def run_in_turn(
    runs: list[Run],
    command: list[str],
    *,
    budget_s: float,
    min_run_s: float,
    out: Path,
    keep: str,
    figures: tuple[Figure, ...] = (),
) -> list[Outcome]:
    """Each run's ``python3 COMMAND`` in turn, within ``budget_s`` seconds from now."""
    deadline = time.monotonic() + budget_s
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="in-turn-") as unpacked:
        trees = Trees(Path(unpacked))
        for number, run in enumerate(runs, start=1):
            left = deadline - time.monotonic()
            if left < min_run_s:
                outcomes.append(Outcome(run, "skipped"))
                continue
            folder = trees.folder(run.tree)
            environment = {
                **os.environ,
                **run.settings,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])),
                "PYTHONUNBUFFERED": "1",
            }
            log_path = out / f"{number}-{run.name}.log"
            started = time.monotonic()
            with log_path.open("w") as log:
                try:
                    finished = subprocess.run(
                        [sys.executable, *command],
                        cwd=folder,
                        env=environment,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        timeout=left,
                    )
                    status = str(finished.returncode)
                except subprocess.TimeoutExpired:
                    status = "stopped"
            log_text = log_path.read_text()
            kept = [line.strip() for line in log_text.splitlines() if re.search(keep, line)]
            values = {figure.label: value for figure in figures if (value := figure.value(log_text)) is not None}
            outcome = Outcome(run, status, time.monotonic() - started, kept, values)
            outcomes.append(outcome)
            print(table_row(number, outcome), flush=True)
    return outcomes


def table_row(number: int, outcome: Outcome) -> str:
    run = outcome.run
    tree = run.tree.name if run.tree else "this repository"
    return (
        f"| {number} | {run.name} | {tree} | {run.described()} | {outcome.status} | {outcome.seconds:.0f} "
        f"| {' / '.join(outcome.figures).replace('|', '¦')} |"
    )


TABLE_HEADER = "| run | name | tree | settings | exit | s | figures |\n|---:|---|---|---|---|---:|---|"


def summary(outcomes: list[Outcome], figures: tuple[Figure, ...], baseline: str) -> list[str]:
    """The summary's lines: each figure's values by run name, in the order the names first ran."""
    names = list(dict.fromkeys(outcome.run.name for outcome in outcomes))
    lines = [
        f"| figure | name | runs | mean | least | most | mean against {baseline} |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for figure in figures:
        values = {
            name: [o.values[figure.label] for o in outcomes if o.run.name == name and figure.label in o.values]
            for name in names
        }
        base = statistics.fmean(values[baseline]) if values.get(baseline) else None
        for name, found in values.items():
            if not found:
                continue
            mean = statistics.fmean(found)
            against = "" if base is None or name == baseline else f"{mean / base - 1:+.1%}"
            lines.append(
                f"| {figure.label} | {name} | {len(found)} | {mean:,.6g} | {min(found):,.6g} | {max(found):,.6g} "
                f"| {against} |"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python3 -m bench.in_turn [options] RUN... -- PYTHON-ARGUMENTS (see --help)")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Run.parse, nargs="+", help="NAME[@TREE][:VAR=VALUE,...], in the order run.")
    parser.add_argument("--budget-s", type=float, default=540, help="Seconds for every run together.")
    parser.add_argument("--min-run-s", type=float, default=100, help="Seconds left below which no run starts.")
    parser.add_argument("--out", type=Path, default=Path("."), help="Folder of the runs' logs.")
    parser.add_argument("--keep", default=DEFAULT_KEEP, help="Regex of the log lines the table shows.")
    parser.add_argument(
        "--figure",
        type=Figure.parse,
        action="append",
        help="LABEL=REGEX of a number the summary gathers (repeat; default: the untimed workload and the vocoder).",
    )
    parser.add_argument("--baseline", default="main", help="The run name the summary sets the others against.")
    arguments = parser.parse_args(argv[:split])
    figures = tuple(arguments.figure or map(Figure.parse, DEFAULT_FIGURES))
    command = argv[split + 1 :]
    if not command:
        parser.error("no command after --: give python3's arguments, e.g. -- -m bench.engine_phases ...")
    arguments.out.mkdir(parents=True, exist_ok=True)
    print(TABLE_HEADER, flush=True)
    outcomes = run_in_turn(
        arguments.runs,
        command,
        budget_s=arguments.budget_s,
        min_run_s=arguments.min_run_s,
        out=arguments.out,
        keep=arguments.keep,
        figures=figures,
    )
    # Once more at the end, all together (and the runs left out): the reply of a call shows its last lines.
    print("\n" + TABLE_HEADER)
    for number, outcome in enumerate(outcomes, start=1):
        print(table_row(number, outcome))
    print("\n" + "\n".join(summary(outcomes, figures, arguments.baseline)))


if __name__ == "__main__":
    main()
