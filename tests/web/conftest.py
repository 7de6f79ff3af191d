import dataclasses
import re
import shutil
import subprocess

import flask_migrate
import pytest
import redis

from chattts_farm import redis_keys
from tests.support import CLI, serve_web
from tests.web.databases import DATABASES, fresh_database
from web import create_app
from web.models import db


def pytest_generate_tests(metafunc):
    """Every test gets the embedded default database (SQLite); those marked ``database`` (the jobs, the
    catalog, keys and quotas, migrations, the reconciler) the production one (PostgreSQL) too. Not all:
    on two cores, a PostgreSQL run of every web test added about two minutes; of these, about one."""
    if "database_url" in metafunc.fixturenames:
        kinds = DATABASES if metafunc.definition.get_closest_marker("database") else DATABASES[:1]
        metafunc.parametrize("database_url", kinds, indirect=True)


@pytest.fixture
def database_url(request, tmp_path):
    """A fresh, empty database of the kind the test is parametrized with."""
    return fresh_database(request.param, request, tmp_path)


@pytest.fixture
def make_app(tiny_settings, redis_url, database_url, tmp_path):
    """Build the app on the test's database, migrated to the newest revision; ``settings`` override.

    The test starts with no request held open: Werkzeug's test client closes an answer only when the
    test does, so an earlier test's unread download (or stream) would hold its wait slot on the
    session's Redis until the slot's lease ended (a real server closes every answer)."""
    with redis.Redis.from_url(redis_url) as shared:
        for held in shared.scan_iter(match=redis_keys.wait_slots("*")):
            shared.delete(held)
    built = []

    def make(**settings):
        test_settings = {
            "redis_url": redis_url,
            "data_dir": tmp_path,
            "database_url": database_url,
            "max_request_bytes": 64 * 1024,
            "max_text_chars": 2000,
        }
        configured = dataclasses.replace(tiny_settings, **{**test_settings, **settings})
        app = create_app({"TESTING": True, "SETTINGS": configured})
        with app.app_context():
            flask_migrate.upgrade()
        built.append(app)
        return app

    yield make
    for app in built:  # the pools' connections would otherwise stay open until garbage collection
        with app.app_context():
            db.engine.dispose()


@pytest.fixture
def app(make_app):
    return make_app()


@pytest.fixture
def client(app):
    return app.test_client()


# The pages in a real headless Chromium (Debian's), against the real web server and workers.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-sync",
    "--disable-background-networking",
    "--disable-component-update",
    # The streaming job page plays its audio on arrival; a person's browser asks for a click first.
    "--autoplay-policy=no-user-gesture-required",
]


@pytest.fixture(scope="module")
def web_server(workers, data_dir, tmp_path_factory):
    for base, _ in serve_web(workers, data_dir, tmp_path_factory.mktemp("web") / "farm.db"):
        yield base


@pytest.fixture(scope="module")
def keyed_web_server(workers, data_dir, tmp_path_factory):
    """A web server that requires API keys, and a key made with `chattts-farm keys create`."""
    for base, environment in serve_web(
        workers, data_dir, tmp_path_factory.mktemp("keyed-web") / "farm.db", CHATTTS_FARM_REQUIRE_API_KEY="true"
    ):
        created = subprocess.run(
            [CLI, "keys", "create", "browser-user"], env=environment, capture_output=True, text=True, check=True
        )
        yield base, re.search(r"cf_\S+", created.stdout).group(0)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    assert executable, "chromium is missing: scripts/test installs it (apt-get install chromium)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


def _real_failure(request) -> bool:
    # ERR_ABORTED is the page stopping a load itself: a media element once it has read what it needs
    # (preload="metadata"), a streamed response read to its end. A server that fails a load shows as
    # another error (a reset connection, an empty response, an unfinished chunked body).
    return not (request.resource_type in ("media", "fetch") and request.failure == "net::ERR_ABORTED")


@pytest.fixture
def watched_page(browser):
    """Opens a page in a fresh browser context; gives it with the list its problems go to as they happen:
    console errors, uncaught exceptions, failed requests and responses of 400 or more."""
    contexts = []

    def open_page(url: str, width: int = 1280, scheme: str = "light"):
        context = browser.new_context(viewport={"width": width, "height": 800}, color_scheme=scheme)
        contexts.append(context)
        page = context.new_page()
        problems = []
        page.on("console", lambda message: message.type == "error" and problems.append(message.text))
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.on(
            "requestfailed",
            lambda failed: _real_failure(failed) and problems.append(f"failed ({failed.failure}): {failed.url}"),
        )
        page.on("response", lambda answer: answer.status >= 400 and problems.append(f"{answer.status}: {answer.url}"))
        page.goto(url)
        return page, problems

    yield open_page
    for context in contexts:
        context.close()
