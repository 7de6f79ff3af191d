"""bench/vocoder.py's batch costs in a tiny form: one call of the vocoder for a batch of each window size and
count, and the fit of their times to a cost a batch and a cost a frame."""

import re

from tests.support import run_bench


def test_the_batch_costs_time_one_batch_of_each_size_and_count_and_fit_a_cost_a_batch(tiny_assets, data_dir):
    finished = run_bench(
        "vocoder",
        *("--model", "synthetic-tiny", "--device", "cpu", "--slots", "8", "--batch-costs"),
        data_dir=data_dir,
        timeout_s=300,
    )
    rows = [line.split("|")[1:-1] for line in finished.stdout.splitlines() if re.match(r"\| \d+ \| \d+ \|", line)]
    # The tiny model's windows: 64, 128 and its longest, 192 frames; 1, 3 and 8 of them (8 a batch).
    assert [(int(size), int(count)) for size, count, _, _ in rows] == [
        (size, count) for size in (64, 128, 192) for count in (1, 3, 8)
    ]
    # Op by op on the CPU, a batch decodes its windows' frames, no bucket's.
    assert all(int(decoded.replace(",", "")) == int(size) * int(count) for size, count, decoded, _ in rows)
    assert all(float(ms) > 0 for *_, ms in rows)
    fit = re.search(
        r"fit: (-?[\d.]+) ms a batch, (-?[\d.]+) ms per 1,000 frames: a batch costs (-?[\d,]+) frames", finished.stdout
    )
    assert fit is not None, finished.stdout
    # The time grows with the frames decoded.
    assert float(fit[2]) > 0
