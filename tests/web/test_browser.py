"""The pages in a real headless Chromium (Debian's), against the real web server and workers."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support import free_port

LONG_TEXT = " ".join(f"This is sentence {word} of a text long enough to watch." for word in
                     "abcdefghijklmnopqrstuvwxyz" * 3)
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                  "--disable-background-networking", "--disable-component-update"]


@pytest.fixture(scope="module")
def web_server(farm, data_dir, tmp_path_factory):
    """`chattts-farm web` (gunicorn, migrations first) with its own fresh database."""
    port = free_port()
    database = tmp_path_factory.mktemp("web") / "farm.db"
    environment = {**os.environ, "CHATTTS_FARM_REDIS_URL": farm.redis_url, "CHATTTS_FARM_DATA_DIR": str(data_dir),
                   "CHATTTS_FARM_DATABASE_URL": f"sqlite:///{database}", "CHATTTS_FARM_MODEL": "synthetic-tiny"}
    process = subprocess.Popen([str(Path(sys.executable).parent / "chattts-farm"), "web", "--port", str(port),
                                "--workers", "1"], env=environment)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(base + "/", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, "the web server did not start"
        time.sleep(0.2)
    yield base
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    assert executable, "chromium is missing: scripts/test installs it (apt-get install chromium)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


def test_fill_the_form_watch_progress_and_play_the_audio(browser, web_server):
    page = browser.new_page()
    page.goto(web_server + "/")
    page.fill("#text", LONG_TEXT)
    assert page.text_content("#char-count") == str(len(LONG_TEXT))
    page.fill("#voice-seed", "42")
    page.dblclick("#submit")  # a double click must not send the job twice
    page.wait_for_url("**/jobs/*")

    seen = set()
    deadline = time.monotonic() + 120
    while not page.is_visible("#job-result"):
        assert time.monotonic() < deadline, f"no audio; progress seen {sorted(seen)}"
        seen.add(round(page.eval_on_selector("#job-progress", "bar => bar.value"), 3))
        time.sleep(0.1)
    assert any(0 < value < 1 for value in seen), f"the progress bar never moved: {sorted(seen)}"
    assert page.text_content("#job-status") == "done"
    page.wait_for_function("document.querySelector('#job-audio').readyState >= 1", timeout=30_000)
    assert page.eval_on_selector("#job-audio", "audio => audio.duration") > 1
    assert len(requests.get(web_server + "/api/jobs").json()["jobs"]) == 1


def test_create_a_tagged_voice_and_find_it_by_tag(browser, web_server):
    page = browser.new_page()
    page.goto(web_server + "/voices")
    page.fill("#new-name", "Night reader")
    page.fill("#new-seed", "4242")
    page.fill("#new-tags", "Calm, night")
    with page.expect_navigation():
        page.click("#new-voice-submit")
    page.fill("#filter-tags", "night")
    with page.expect_navigation():
        page.click("#filter")
    assert page.locator("tr.voice").count() == 1
    assert page.input_value("tr.voice .voice-tags") == "calm, night"
    page.fill("#filter-tags", "loud")
    with page.expect_navigation():
        page.click("#filter")
    assert page.locator("tr.voice").count() == 0
