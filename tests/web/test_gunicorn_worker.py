"""`chattts-farm web` as gunicorn runs it: what gunicorn itself refuses is answered in JSON, as the app
answers the rest, and its control socket is the farm's own."""

import pytest
import requests
from gunicorn.ctl.client import ControlClient

from tests.support import serve_web


@pytest.fixture(scope="module")
def web(workers, tmp_path_factory):
    """A web of its own data dir (the workers' store and Redis): the dir its control socket goes under."""
    data_dir = tmp_path_factory.mktemp("web-data")
    for base, _ in serve_web(workers, data_dir, data_dir / "farm.db"):
        yield base, data_dir


def test_a_request_line_past_gunicorns_limit_is_a_json_414(web):
    base, _ = web
    answer = requests.get(f"{base}/api/jobs", params={"status": "x" * 10_000}, timeout=30)
    assert answer.status_code == 414
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json() == {
        "error": "the request line (method, path and query) is longer than 4094 bytes",
        "field": "url",
    }


def test_a_header_past_gunicorns_limit_is_a_json_431(web):
    base, _ = web
    answer = requests.get(f"{base}/api/jobs", headers={"X-Large": "x" * 10_000}, timeout=30)
    assert answer.status_code == 431
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json()["field"] == "headers"
    assert "longer than 8190 bytes" in answer.json()["error"]


def test_the_control_socket_is_under_the_farms_data_dir_and_answers_for_this_web(web):
    base, data_dir = web
    port = base.rsplit(":", 1)[1]
    with ControlClient(str(data_dir / f"gunicorn-{port}.ctl"), timeout=10) as control:
        listeners = control.send_command("show listeners")["listeners"]
    assert [listener["address"] for listener in listeners] == [f"http://127.0.0.1:{port}"]
