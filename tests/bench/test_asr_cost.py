"""bench/asr_cost.py in a tiny form: the workload with the ASR gate off and with Whisper of random weights
(synthetic-tiny: no Whisper weights can be had here), side by side in one run on the CPU."""

from tests.support import markdown_table, run_bench


def test_the_engines_throughput_with_the_gate_off_and_on_and_what_the_listener_did(tiny_assets, data_dir):
    finished = run_bench(
        "asr_cost",
        *("--model", "synthetic-tiny", "--device", "cpu", "--jobs", "2", "--seconds", "1-2"),
        *("--asr", "off,whisper", "--whisper-model", "synthetic-tiny"),
        data_dir=data_dir,
        timeout_s=400,
    )
    off, whisper = markdown_table(finished.stdout.splitlines(), "| ASR |")
    assert (off["ASR"], whisper["ASR"]) == ("off", "whisper")
    for row in (off, whisper):
        assert row["jobs"] == row["done"] == "2", row
        assert float(row["audio-s/s"]) > 0, row
    assert off["vs off"] == "1.000" and float(whisper["vs off"]) > 0
    assert off["segments heard"] == off["listener batches"] == "-"
    # Random weights hear every segment wrong; with retries off each one-segment job is heard once.
    assert whisper["segments heard"] == "2"
    assert 1 <= int(whisper["listener batches"]) <= 2
    assert float(whisper["ms a batch"]) > 0 and float(whisper["listener segments/s"]) > 0
    assert 0 < float(whisper["listener busy"]) <= 1
