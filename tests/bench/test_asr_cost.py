"""bench/asr_cost.py in a tiny form: the workload with the ASR gate off and with Whisper of random weights
(synthetic-tiny: no Whisper weights can be had here), side by side in one run on the CPU."""

import pytest

from tests.support import markdown_table, run_bench


def test_the_engines_throughput_with_the_gate_off_and_on_at_each_listener_batch_and_what_the_listener_did(
    tiny_assets, data_dir, tmp_path
):
    finished = run_bench(
        "asr_cost",
        *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "2", "--seconds", "1-2"),
        *("--asr", "off,whisper", "--whisper-model", "synthetic-tiny", "--asr-batch", "1,32", "--timeline"),
        *("--whisper-length", "text,limit", "--runtime-calls", "--py-spy", str(tmp_path)),
        data_dir=data_dir,
        timeout_s=400,
    )
    off, one_by_one, together, one_to_limit, together_to_limit = markdown_table(finished.stdout.splitlines(), "| ASR |")
    assert [row["ASR"] for row in (off, one_by_one, together, one_to_limit, together_to_limit)] == [
        "off",
        "whisper, batches of 1",
        "whisper, batches of 32",
        "whisper, every decode to its limit, batches of 1",
        "whisper, every decode to its limit, batches of 32",
    ]
    # Random weights' decodes end after their texts' tokens (a step each, the prompt's pass drawing the first,
    # one more drawing the end), or run on to their limit, twice as many and ten more.
    text_steps = float(one_by_one["decoding steps a batch"])
    assert text_steps > 2 and float(one_to_limit["decoding steps a batch"]) == 2 * (text_steps - 1) + 10
    assert off["decoding steps a batch"] == "-"
    for row in (off, one_by_one, together):
        assert row["jobs"] == row["done"] == "2", row
        assert float(row["audio-s/s"]) > 0, row
    assert off["vs the last run off"] == "1.000" and float(together["vs the last run off"]) > 0
    assert off["segments heard"] == off["listener batches"] == "-"
    # Random weights hear every segment wrong; with retries off each one-segment job is heard once.
    assert one_by_one["segments heard"] == together["segments heard"] == "2"
    assert one_by_one["listener batches"] == "2" and 1 <= int(together["listener batches"]) <= 2
    for whisper in (one_by_one, together):
        assert float(whisper["ms a batch"]) > 0 and float(whisper["listener segments/s"]) > 0
        assert 0 < float(whisper["listener busy"]) <= 1
        # What came after the engine's last step is part of the wall (the last verdict may come within that
        # step's wait for it); with the gate off nothing waits past the engine.
        assert 0 <= float(whisper["past the engine s"]) < float(whisper["wall s"])
    assert off["past the engine s"] == "0.00"
    for row in (off, one_by_one, together):
        # The thread's wall is its waits for the device (none on a CPU) and the rest.
        waiting, other = float(row["engine waiting for the GPU s"]), float(row["engine's other s"])
        assert waiting == 0 and other == float(row["wall s"]), row
    # Each run's timeline of the engine's thread, in the order run.
    lines = finished.stdout.splitlines()
    titles = [line for line in lines if line.startswith("the engine's thread, ASR")]
    rows = (off, one_by_one, together, one_to_limit, together_to_limit)
    assert titles == [f"the engine's thread, ASR {row['ASR']}:" for row in rows]
    for title in titles:
        steps = markdown_table([line.strip() for line in lines[lines.index(title) + 1 :]], "| running |")
        assert steps and sum(int(row["steps"]) for row in steps) > 0, steps
    # And the CUDA runtime's calls of each run, by thread: none on a CPU, only the table's header.
    titles = [line for line in lines if line.startswith("the CUDA runtime's calls over ASR")]
    assert len(titles) == 5
    for title in titles:
        assert markdown_table(lines[lines.index(title) + 1 :], "| thread | call |") == []
    # Nor any work of the GPU's: nothing busy, no stream.
    titles = [line for line in lines if line.startswith("the GPU's work over ASR")]
    assert [title.split(": ")[1].split(" s of")[0] for title in titles] == ["any stream busy 0.00"] * 5
    for title in titles:
        assert markdown_table(lines[lines.index(title) + 1 :], "| stream |") == []
    # With --py-spy, where the process's threads were over each run: the engine's (the main thread) in
    # every run, the listener's beside it where the gate was on.
    titles = [line for line in lines if line.startswith("where this process's threads were")]
    assert titles == [f"where this process's threads were over ASR {row['ASR']}'s workload (py-spy):" for row in rows]
    for title, row in zip(titles, rows, strict=True):
        threads = {thread["thread"]: thread for thread in markdown_table(lines[lines.index(title) :], "| thread |")}
        assert int(threads["MainThread"]["samples"]) > 0, threads
        assert ("asr" in threads) == (row["ASR"] != "off"), threads


def test_each_switch_interval_runs_every_choice_and_each_run_is_set_against_the_gate_off_at_its_interval(
    tiny_assets, data_dir
):
    finished = run_bench(
        "asr_cost",
        *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "1", "--seconds", "1-1"),
        *("--asr", "off,whisper", "--whisper-model", "synthetic-tiny", "--switch-interval-ms", "0.5,0.1"),
        data_dir=data_dir,
        timeout_s=300,
    )
    rows = markdown_table(finished.stdout.splitlines(), "| ASR |")
    assert [row["ASR"] for row in rows] == [
        "off, switch 0.5 ms",
        "whisper, switch 0.5 ms",
        "off, switch 0.1 ms",
        "whisper, switch 0.1 ms",
    ]
    first_off, first_whisper, second_off, second_whisper = rows
    assert first_off["vs the last run off"] == second_off["vs the last run off"] == "1.000"
    for whisper, off in ((first_whisper, first_off), (second_whisper, second_off)):
        # From the table's rounded throughputs: a tiny run's are a few audio-s/s, to one decimal.
        expected = float(whisper["audio-s/s"]) / float(off["audio-s/s"])
        assert float(whisper["vs the last run off"]) == pytest.approx(expected, rel=0.05), (whisper, off)


def test_rounds_run_every_choice_in_turn_and_set_each_gated_run_against_the_runs_off_on_either_side(
    tiny_assets, data_dir
):
    finished = run_bench(
        "asr_cost",
        *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "1", "--seconds", "1-1"),
        *("--asr", "off,whisper", "--whisper-model", "synthetic-tiny", "--rounds", "2"),
        data_dir=data_dir,
        timeout_s=300,
    )
    lines = finished.stdout.splitlines()
    rows = markdown_table(lines, "| ASR |")
    assert [row["ASR"] for row in rows] == ["off", "whisper", "off", "whisper", "off"]
    throughputs = [float(row["audio-s/s"]) for row in rows]
    # From the table's rounded throughputs: a tiny run's are a few audio-s/s, to one decimal.
    expected = [
        throughputs[1] / ((throughputs[0] + throughputs[2]) / 2),
        throughputs[3] / ((throughputs[2] + throughputs[4]) / 2),
    ]
    (summary,) = markdown_table(lines, "| ASR | rounds |")
    assert summary["ASR"] == "whisper" and summary["rounds"] == "2"
    each = [float(share) for share in summary["each round"].split(", ")]
    assert each == pytest.approx(expected, rel=0.05)
    assert float(summary["least"]) == min(each) and float(summary["most"]) == max(each)
    assert float(summary["median"]) == pytest.approx(sum(each) / 2, abs=0.001)


def test_a_gated_run_with_no_run_off_after_it_is_set_against_the_one_before():
    from bench.asr_cost import Run, shares_beside_the_gate_off
    from worker.asr.listener import ListenerFigures

    def ran(asr: str, audio_per_wall: float) -> Run:
        heard = None if asr == "off" else ListenerFigures(1, 1, 0.1)
        return Run(asr, 1, 1, audio_per_wall, 1.0, heard, None, 0.0, 0.0, None, None, [])

    runs = [ran("off", 100.0), ran("whisper", 90.0), ran("off", 80.0), ran("offline", 60.0), ran("whisper", 72.0)]
    assert shares_beside_the_gate_off(runs) == {
        "whisper": [pytest.approx(1.0), pytest.approx(0.9)],
        "offline": [pytest.approx(0.75)],
    }
    # A gated run before any run off has nothing to be set against.
    assert shares_beside_the_gate_off([ran("whisper", 90.0), ran("off", 100.0)]) == {}


def test_the_gpus_busy_time_counts_once_what_two_streams_ran_at_once():
    from bench.asr_cost import DeviceWork, busy_s

    work = [
        DeviceWork(7, "engine's step", 0.0, 400.0),
        DeviceWork(9, "listener's encoder", 100.0, 300.0),  # inside the step's span
        DeviceWork(9, "listener's decoder", 350.0, 600.0),  # overlapping its end
        DeviceWork(7, "vocoder", 1_000.0, 1_100.0),  # after a gap
    ]
    assert busy_s(work) == pytest.approx(700e-6)
    assert busy_s(list(reversed(work))) == pytest.approx(700e-6)
    assert busy_s([]) == 0
