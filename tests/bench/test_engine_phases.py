"""bench/engine_phases.py in a tiny form: every phase of the synthesizer is timed, the decode step alone too,
the untimed pass's timeline accounts for its steps, and profiles of the host (a few steps, a workload's tail) run."""

import re

from tests.support import run_bench
from worker.engine.engine import SYNC_EVERY


def table_after(lines: list[str], header: str) -> dict[str, list[str]]:
    """The rows of the first table whose header holds ``header``: first cell -> the other cells."""
    start = next(index for index, line in enumerate(lines) if header in line) + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("  | "):
            break
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_phases_of_a_workload_are_timed_on_the_cpu(tiny_assets, data_dir):
    finished = run_bench(
        "engine_phases",
        *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "4", "--slots", "4"),
        *("--kv-dtypes", "model,fp8", "--seconds", "1-2", "--profile-steps", "2", "--profile-run"),
        data_dir=data_dir,
        timeout_s=300,
    )
    output = finished.stdout
    assert output.count("audio-s per wall-s (phases timed)") == 2  # both cache dtypes
    lines = output.splitlines()
    phases = {name: float(cells[0]) for name, cells in table_after(lines, "| phase |").items()}
    assert {"prefill", "decode step", "vocoder", "finish"} <= set(phases)
    assert phases["decode step"] > 0 and phases["vocoder"] > 0
    assert "decode step of 4 slot(s)" in output
    # Every job's one segment is prefilled once; padding only adds to its tokens.
    prefill_line = r"prefill: (\d+) prompts, ([\d,]+) tokens \(([\d,]+) padded .*, ([\d,]+) prompt tokens/s"
    prefills = re.findall(prefill_line, output)
    assert len(prefills) == 2  # both cache dtypes
    for prompts, tokens, padded, rate in ([int(figure.replace(",", "")) for figure in row] for row in prefills):
        assert prompts == 4 and 0 < tokens <= padded and rate > 0
    # The timeline: the first step admits (0 running), the rest ran 1-64 segments.
    timeline = table_after(lines, "| running |")
    assert "0" in timeline and int(timeline["1-64"][0]) > 0 and float(timeline["1-64"][1]) > 0
    # Its decode steps (up to SYNC_EVERY a synthesizer step); the waits and the host's launches within its
    # wall: the first step's prefill, the vocoder's rows as segments end (on the CPU, decoded there and then).
    steps, wall, decode_steps, _, snapshots, audio, prefills, vocoder, collections = timeline["1-64"]
    assert 0 < int(decode_steps) <= SYNC_EVERY * int(steps)
    assert float(snapshots) + float(audio) + float(prefills) + float(vocoder) <= float(wall)
    assert float(vocoder) > 0 and float(timeline["0"][6]) > 0
    assert re.fullmatch(r"\d+\.\d{3} \(\d+\)", collections)  # the collector's pauses (its full passes)
    assert output.count("the host over 2 steps (cProfile, by own time)") == 2
    # The host's profile of a workload's tail, the synthesizer's steps in it (the sync count is CUDA's alone).
    assert output.count("the host over the workload's tail (cProfile, by time with callees)") == 2
    assert "pipeline.py" in output.split("the host over the workload's tail")[1]


def test_every_request_can_stream_its_audio_as_it_is_drawn(tiny_assets, data_dir):
    finished = run_bench(
        "engine_phases",
        *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "4", "--slots", "4"),
        *("--kv-dtypes", "model", "--seconds", "1-2", "--streamed"),
        data_dir=data_dir,
        timeout_s=300,
    )
    rates = re.findall(r"4 jobs: [\d.]+ s, ([\d.]+) audio-s per wall-s \((phases \w+, streamed)\)", finished.stdout)
    assert [how for _, how in rates] == ["phases untimed, streamed", "phases timed, streamed"]
    assert all(float(rate) > 0 for rate, _ in rates)
    phases = table_after(finished.stdout.splitlines(), "| phase |")
    assert int(phases["vocoder"][1]) > 0
