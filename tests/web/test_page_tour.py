"""Every page, as a person sees it on a phone (375 px) and on a desktop (1280 px), in a real headless
Chromium against the real web server and workers: it loads with no console error, no failed request and
no response of 400 or more (a favicon's 404 included), nothing wider than the screen, and what it draws
(charts, a waveform) drawn. Each visit leaves a screenshot: `scripts/screenshots` keeps them in
docs/screenshots."""

import time
from pathlib import Path

import pytest
import requests

from tests.web.test_browser import LONG_TEXT

WIDTHS = {"phone": 375, "desktop": 1280}
# Pages also shown in dark mode (the system setting), on a desktop.
DARK = {"ops", "job", "voices"}


@pytest.fixture(scope="module")
def screenshots(request, tmp_path_factory) -> Path:
    chosen = request.config.getoption("--screenshots")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def farm_with_history(web_server):
    """A farm that has done some work: tagged voices and a blend of them, a streamed job, a finished job
    and a finished batch to look at."""
    for name, seed, tags in (("Calm narrator", 11, ["calm", "narrator"]), ("Bright host", 12, ["bright"])):
        added = requests.post(web_server + "/api/voices", json={"name": name, "seed": seed, "tags": tags}, timeout=30)
        added.raise_for_status()
    blend = {"name": "Calm and bright", "mix": [{"voice": "Calm narrator", "weight": 2}, {"voice": "Bright host"}]}
    requests.post(web_server + "/api/voices", json=blend, timeout=30).raise_for_status()
    requests.post(web_server + "/api/jobs", json={"text": LONG_TEXT[:200], "stream": True}, timeout=10)
    job = requests.post(
        web_server + "/api/jobs", json={"text": LONG_TEXT[:300], "voice": "Calm narrator"}, timeout=10
    ).json()
    batch = requests.post(
        web_server + "/api/batches",
        json={
            "items": [
                {"text": f"Item {number} of the tour's batch.", "custom_id": f"tour-{number}"} for number in range(3)
            ]
        },
        timeout=10,
    ).json()
    deadline = time.monotonic() + 120
    while requests.get(web_server + job["status_url"], timeout=10).json()["status"] != "done":
        assert time.monotonic() < deadline, "the tour's job never finished"
        time.sleep(0.5)
    while requests.get(web_server + batch["status_url"], timeout=10).json()["status"] != "done":
        assert time.monotonic() < deadline, "the tour's batch never finished"
        time.sleep(0.5)
    return {"job": f"/jobs/{job['id']}", "batch": f"/batches/{batch['id']}"}


def pages(farm_with_history) -> dict[str, str]:
    return {
        "speak": "/",
        "jobs": "/jobs",
        "job": farm_with_history["job"],
        "batches": "/batches",
        "batch": farm_with_history["batch"],
        "voices": "/voices",
        "ops": "/ops",
        "sign-in": "/sign-in",
    }


def drawn(page, name: str) -> bool:
    """Whether a page that draws has drawn: the ops charts their points, the job page its waveform."""
    if name == "ops":
        return int(page.get_attribute("[data-chart=throughput]", "data-points") or 0) > 0
    if name == "job":
        return page.get_attribute("#job-waveform", "data-samples") is not None
    if name == "batch":
        return page.locator("#batch-items audio").count() == 3
    return True


# The elements that reach past the right edge of the screen (none when the page fits).
WIDER_THAN_THE_SCREEN = """() => document.documentElement.scrollWidth <= window.innerWidth ? [] :
  [...document.querySelectorAll("body *")]
    .filter((element) => element.getBoundingClientRect().right > window.innerWidth)
    .filter((element) => !element.closest(".table-scroll"))
    .map((element) => `${element.tagName.toLowerCase()}#${element.id}.${element.className}`).slice(0, 10)"""


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_loads_cleanly_fits_the_screen_and_draws(
    watched_page, web_server, farm_with_history, screenshots, width
):
    for name, path in pages(farm_with_history).items():
        for scheme in ("light", "dark") if width == "desktop" and name in DARK else ("light",):
            page, problems = watched_page(web_server + path, WIDTHS[width], scheme)
            page.wait_for_load_state("networkidle")
            deadline = time.monotonic() + 30
            while not drawn(page, name):
                assert time.monotonic() < deadline, f"{name} at {width} never drew"
                time.sleep(0.2)

            shot = screenshots / f"{name}-{WIDTHS[width]}{'-dark' if scheme == 'dark' else ''}.png"
            page.screenshot(path=shot, full_page=True)

            overflow = page.evaluate(WIDER_THAN_THE_SCREEN)
            assert overflow == [], f"{name} at {width}: wider than the screen: {overflow}"
            assert problems == [], f"{name} at {width} ({scheme}): {problems}"
            assert shot.stat().st_size > 5000


def test_the_speak_pages_ssml_help_opened_fits_a_phone(watched_page, web_server):
    page, problems = watched_page(web_server + "/", WIDTHS["phone"])
    page.click("#ssml-help summary")
    assert page.is_visible("#ssml-help code") and "x-strong 1250 ms" in page.inner_text("#ssml-help")
    assert page.evaluate(WIDER_THAN_THE_SCREEN) == [] and problems == []
