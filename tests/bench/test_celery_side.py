"""bench/celery_side.py in a tiny form: a real worker's Celery side, its engine answering at once, every way."""

from tests.support import markdown_table, run_bench


def test_every_way_finishes_every_job_and_reports_the_celery_sides_cpu(data_dir, tmp_path):
    finished = run_bench(
        "celery_side",
        *("--jobs", "24", "--jobs-in-flight", "8", "--ways", "wav,mp3,wav streamed", "--workdir", str(tmp_path)),
        data_dir=data_dir,
    )
    rows = markdown_table(finished.stdout.splitlines(), "| way |")
    assert [row["way"] for row in rows] == ["wav", "mp3", "wav streamed"]
    for row in rows:
        assert row["jobs"] == "24" and float(row["jobs/s"]) > 0 and float(row["Celery process CPU ms a job"]) > 0
        # A job is sent, taken, started, stored and acknowledged: more than a handful of round trips.
        assert float(row["Redis reads a job"]) > 5 and float(row["Redis commands a job"]) > 5
    # mp3 is encoded by the worker's encoder processes, wav in its job threads.
    assert float(rows[1]["encoders' CPU ms a job"]) > 0 and float(rows[0]["encoders' CPU ms a job"]) == 0
