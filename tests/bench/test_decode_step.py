"""bench/decode_step.py in a tiny form on the CPU: the decode step's table (with fp8 matmuls too), and the
join table (issue 21's "the step-time spike when 64 prompts join")."""

import pytest

from tests.support import markdown_table, run_bench


def test_prompts_that_join_running_rows_are_timed_at_the_step_that_runs_their_prefill_and_either_side_of_it(
    tiny_assets, data_dir
):
    finished = run_bench(
        "decode_step",
        *("--model", "synthetic-tiny", "--device", "cpu", "--rows", "1", "--steps", "8"),
        *("--matmul-dtypes", "model,fp8"),
        *("--join-rows", "2,4", "--joining", "3", "--join-rounds", "2"),
        data_dir=data_dir,
        timeout_s=300,
    )
    lines = finished.stdout.splitlines()
    steps = markdown_table(lines, "| way |")
    assert [(row["way"], row["rows"]) for row in steps] == [
        ("eager-dynamic", "1"),
        ("engine-eager", "1"),
        ("engine-eager fp8-matmuls", "1"),
    ]
    assert all(float(row["ms/step"]) > 0 for row in steps)
    joins = markdown_table(lines, "| rows running |")
    assert [(row["rows running"], row["prompts joining"]) for row in joins] == [("2", "3"), ("4", "3")]
    for row in joins:
        # Every joining prompt was admitted at that step and runs beside the rows already running.
        assert int(row["running after"]) == int(row["rows running"]) + 3, row
        # Three prompts of the same sentence, each with its text's tokens.
        assert int(row["their prompt tokens"]) > 3 and int(row["their prompt tokens"]) % 3 == 0, row
        before, joined, after = (
            float(row[name]) for name in ("step before ms", "the step they join at ms", "step after ms")
        )
        assert before > 0 and joined > 0 and after > 0, row
        # The spike is the join's step against a step of the same rows without a prefill.
        assert float(row["spike ms"]) == pytest.approx(joined - after, abs=0.02), row
