"""bench/asr_listener.py in a tiny form: one listener batch of two clips on the CPU, Whisper of random weights
(synthetic-tiny), each phase timed and the batch's operations listed."""

from tests.support import markdown_table, run_bench


def test_a_listener_batch_is_timed_whole_and_by_phase_and_its_operations_are_listed(data_dir):
    finished = run_bench(
        "asr_listener",
        *("--device", "cpu", "--clips", "2", "--seconds", "1-2", "--repeat", "1", "--kernels", "5"),
        data_dir=data_dir,
        timeout_s=300,
    )
    lines = finished.stdout.splitlines()
    phases = {row["phase"]: float(row["ms a batch"]) for row in markdown_table(lines, "| phase |")}
    whole = phases.pop("the whole batch (what the listener runs)")
    [rest] = [phase for phase in phases if phase.startswith("the rest: ")]
    assert list(phases) == ["spectrograms", "encoder, op by op", "encoder, compiled", rest]
    # Random weights end each clip after its text's tokens: a step each, and one for the prompt's pass.
    assert float(rest.removeprefix("the rest: ").split()[0]) > 2
    timed = [whole, phases["spectrograms"], phases["encoder, op by op"], phases["encoder, compiled"]]
    assert all(ms > 0 for ms in timed)
    # On the CPU the decoder encodes op by op: the rest is the whole batch less its spectrograms and that. Each is
    # timed apart, so on a busy machine (two test workers on two cores) the rest can come out below zero.
    assert abs(phases[rest] - (whole - phases["spectrograms"] - phases["encoder, op by op"])) < 0.02
    table = lines[lines.index("the whole batch's operations and kernels, by cpu_time_total:") + 1 :]
    assert any("aten::scaled_dot_product_attention" in line for line in table)
