"""bench/latency.py in a tiny form: every level's streams end, with their first chunks and no failure."""

from tests.support import markdown_table, run_bench


def test_every_level_streams_every_job_and_reports_its_first_chunk(tiny_assets, data_dir, tmp_path):
    finished = run_bench(
        "latency",
        *("--model", "synthetic-tiny", "--cpu", "1", "--clients", "1,3", "--seconds", "1", "--workdir", str(tmp_path)),
        "--engine",
        "--web",
        data_dir=data_dir,
    )
    rows = markdown_table(finished.stdout.splitlines(), "| path |")
    paths = [(row["path"], row["clients"]) for row in rows]
    levels = [("engine", "1"), ("engine", "3"), ("farm", "1"), ("farm", "3"), ("web", "1"), ("web", "3")]
    assert paths == [*levels, ("farm, not streamed", "3")]
    for row in rows[: len(levels)]:
        assert row["failed"] == "0"
        assert 0 < float(row["first chunk p50 ms"]) <= float(row["p95 ms"]) <= float(row["p99 ms"])
    assert all(float(row["audio-s/s"]) > 0 for row in rows)
