"""The job page shows what the ASR gate heard beside what each segment was asked to say, in a real headless
Chromium, for a job that really went through a CPU worker with the offline recogniser on."""

import time

import pytest
import requests

from cli.local_services import free_port, start_redis_server
from tests.support import Workers, serve_web
from tests.web.test_page_tour import WIDER_THAN_THE_SCREEN

TEXT = "The first sentence. The second one follows it."
PHONE_WIDTH = 375


@pytest.fixture(scope="module")
def listening_web_server(data_dir, tmp_path_factory):
    """A web server and one CPU worker hearing every segment with the offline recogniser, on a Redis of
    their own (the session's workers do not listen)."""
    folder = tmp_path_factory.mktemp("listening-farm")
    port = free_port()
    redis_server = start_redis_server(port, folder / "redis", "--save", "", "--appendonly", "no")
    workers = Workers.start(
        f"redis://127.0.0.1:{port}/0", data_dir, folder / "workers.log", count=1, CHATTTS_FARM_ASR="offline"
    )
    try:
        for base, _ in serve_web(workers, data_dir, folder / "farm.db"):
            yield base
    finally:
        workers.stop()
        redis_server.terminate()
        redis_server.wait(timeout=20)


def finished_job(web_server: str) -> dict:
    job = requests.post(web_server + "/api/jobs", json={"text": TEXT}, timeout=10).json()
    deadline = time.monotonic() + 300
    while (described := requests.get(web_server + job["status_url"], timeout=10).json())["status"] != "done":
        assert described["status"] in ("queued", "running"), described
        assert time.monotonic() < deadline, "the job never finished"
        time.sleep(0.5)
    return described


def heard_rows(page) -> list[dict[str, str]]:
    headers = page.locator("#job-asr thead th").all_inner_texts()
    return [
        dict(zip(headers, row.locator("td").all_inner_texts(), strict=True))
        for row in page.locator("#job-asr-segments tr").all()
    ]


def test_each_segment_heard_is_listed_beside_its_text_with_the_jobs_mismatch_on_a_phone(
    listening_web_server, watched_page
):
    job = finished_job(listening_web_server)
    segments = job["result"]["quality"]["segments"]
    page, problems = watched_page(f"{listening_web_server}/jobs/{job['id']}", PHONE_WIDTH)
    page.wait_for_selector("#job-asr", state="visible", timeout=30_000)

    assert page.locator("#job-asr thead th").all_inner_texts() == [
        "Segment",
        "Asked for",
        "Heard",
        "Error rate",
        "Passed",
    ]
    # Synthetic weights' audio is noise: every segment was heard saying something else, and the job says so.
    rows = heard_rows(page)
    assert len(rows) == len(segments) >= 1
    for number, (row, segment) in enumerate(zip(rows, segments, strict=True), start=1):
        asr = segment["asr"]
        assert asr["said"] and asr["said"] in TEXT  # a segment's text is a piece of the job's
        assert row["Segment"] == str(number)
        assert row["Asked for"] == asr["said"]
        assert row["Heard"] == (asr["heard"] or "(nothing)")
        assert row["Error rate"] == f"{round(asr['error_rate'] * 100)}%"
        assert row["Passed"] == "no"
    assert "asr_mismatch" in job["result"]["quality"]["flags"]
    assert page.text_content("#job-asr-verdict").startswith("asr_mismatch:")
    assert page.evaluate(WIDER_THAN_THE_SCREEN) == []
    assert problems == []
