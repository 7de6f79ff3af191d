"""bench/celery_side.py in a tiny form: a real worker's Celery side, its engine a stand-in, every way."""

from tests.support import markdown_table, run_bench


def test_every_way_finishes_every_job_and_reports_the_celery_sides_cpu_and_how_soon_jobs_reached_the_engine(
    data_dir, tmp_path
):
    finished = run_bench(
        "celery_side",
        *("--jobs", "24", "--jobs-in-flight", "8", "--ways", "wav,mp3,wav streamed", "--workdir", str(tmp_path)),
        *("--hold-s", "0.5"),
        data_dir=data_dir,
    )
    lines = finished.stdout.splitlines()
    assert any("its engine answering 0.5 s after each job arrived" in line for line in lines)
    rows = markdown_table(lines, "| way |")
    assert [row["way"] for row in rows] == ["wav", "mp3", "wav streamed"]
    for row in rows:
        assert row["jobs"] == "24" and float(row["jobs/s"]) > 0 and float(row["Celery process CPU ms a job"]) > 0
        # A job is sent, taken, started, stored and acknowledged: more than a handful of round trips.
        assert float(row["Redis reads a job"]) > 5 and float(row["Redis commands a job"]) > 5
        # Eight held at a time, each answered 0.5 s after it reached the engine: three rounds at least.
        p50, p95 = (float(figure) for figure in row["reached the engine p50 / p95 s"].split(" / "))
        assert 0 <= p50 <= p95 < float(row["wall s"]) - 0.5, row
        # A job thread takes each job before it reaches the engine; with eight at a time, most wait for one.
        taken_p50, taken_p95 = (float(figure) for figure in row["a job thread took it p50 / p95 s"].split(" / "))
        assert taken_p50 <= p50 and taken_p95 <= p95 and taken_p95 > 0.5, row
        assert float(row["wall s"]) >= 1.5 and 0 < float(row["sent in s"]) < float(row["wall s"]), row
    # mp3 is encoded by the worker's encoder processes, wav in its job threads.
    assert float(rows[1]["encoders' CPU ms a job"]) > 0 and float(rows[0]["encoders' CPU ms a job"]) == 0
