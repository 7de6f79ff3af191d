"""Signed callbacks end to end: a job submitted to the web with a callback_url runs on a real worker,
and that worker's delivery task POSTs the job's status to a real HTTP receiver in this test, signed,
retried, never redirected, and never to an address the farm must not reach. The receiver listens on
127.0.0.1, which the farm here allows (CHATTTS_FARM_CALLBACK_ALLOWED_HOSTS); other loopback names and
addresses stay refused."""

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis
import requests

from chattts_farm import redis_keys
from chattts_farm.callbacks import CALLBACK_QUEUE, SIGNATURE_HEADER
from chattts_farm.contract import TASK_NAME
from cli.local_services import free_port, start_redis_server
from tests.support import Workers, readme_callback_check, serve_web
from web import callbacks, reconcile
from web.models import CallbackState, Job, JobStatus, db, utcnow

SECRET = "the farm's callback secret"
ATTEMPTS = 3
CALLBACK_SETTINGS = {
    "CHATTTS_FARM_CALLBACK_SECRET": SECRET,
    "CHATTTS_FARM_CALLBACK_ALLOWED_HOSTS": "127.0.0.1",
    "CHATTTS_FARM_CALLBACK_ATTEMPTS": str(ATTEMPTS),
    "CHATTTS_FARM_CALLBACK_BACKOFF_S": "0.2",
    "CHATTTS_FARM_CALLBACK_TIMEOUT_S": "5",
}


class Receiver(ThreadingHTTPServer):
    """An HTTP server that records every request and answers each path from a script (200 once it runs out)."""

    def __init__(self):
        super().__init__(("127.0.0.1", free_port()), _Handler)
        self.received: list[tuple[str, dict, bytes]] = []
        self.scripts: dict[str, list[int]] = {}

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.server_address[1]}{path}"

    def calls(self, path: str) -> list[tuple[dict, bytes]]:
        return [(headers, body) for called, headers, body in self.received if called == path]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, dict(self.headers), body))
        script = self.server.scripts.get(self.path) or [200]
        status = script.pop(0) if len(script) > 1 else script[0]
        self.send_response(status)
        if 300 <= status < 400:
            self.send_header("Location", self.server.url("/redirected-to"))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


@pytest.fixture(scope="module")
def callback_workers(tmp_path_factory, data_dir, tiny_assets):
    """A Redis of this module's own and a worker on it set up to deliver callbacks."""
    port = free_port()
    folder = tmp_path_factory.mktemp("callbacks")
    server = start_redis_server(port, folder / "redis", "--save", "", "--appendonly", "no")
    workers = Workers.start(
        f"redis://127.0.0.1:{port}/0", data_dir, folder / "workers.log", count=1, **CALLBACK_SETTINGS
    )
    yield workers
    workers.stop()
    server.terminate()
    server.wait(timeout=20)


@pytest.fixture(scope="module")
def callback_web_server(callback_workers, data_dir, tmp_path_factory):
    """`chattts-farm web` on this module's farm, for the page in a real browser."""
    database = tmp_path_factory.mktemp("callback-web") / "farm.db"
    for base, _ in serve_web(callback_workers, data_dir, database, **CALLBACK_SETTINGS):
        yield base


@pytest.fixture
def receiver():
    server = Receiver()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def app(make_app, callback_workers):
    return make_app(
        redis_url=callback_workers.redis_url,
        callback_secret=SECRET,
        callback_allowed_hosts="127.0.0.1",
        callback_attempts=ATTEMPTS,
    )


def submit(client, callback_url: str, text: str = "Call me back when it is done.") -> str:
    answer = client.post("/api/jobs", json={"text": text, "callback_url": callback_url})
    assert answer.status_code == 202, answer.get_json()
    return answer.get_json()["id"]


def wait_for(check, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


def finished_status(client, job_id: str) -> dict:
    """The job's status once its callback's delivery is over (polling it is what notices its end)."""

    def over() -> dict | None:
        status = client.get(f"/api/jobs/{job_id}").get_json()
        return status if status["callback"]["state"] in ("delivered", "failed") else None

    return wait_for(over, f"the callback of job {job_id} to be over")


def test_a_receiver_that_answers_500_then_200_gets_the_job_status_twice_with_a_valid_signature(client, receiver):
    receiver.scripts["/flaky"] = [500, 200]
    job_id = submit(client, receiver.url("/flaky"))
    status = finished_status(client, job_id)

    calls = receiver.calls("/flaky")
    assert len(calls) == 2
    is_from_the_farm = readme_callback_check()
    for headers, body in calls:
        assert is_from_the_farm(body, headers[SIGNATURE_HEADER], SECRET)
        assert headers["Content-Type"] == "application/json"
    assert calls[0][1] == calls[1][1]  # the same body, again
    sent = json.loads(calls[0][1])
    # The status the API answers, as it was when the job ended (its callback then still to be sent).
    assert sent["callback"] == {"url": receiver.url("/flaky"), "state": "pending", "attempts": []}
    assert {**sent, "callback": None} == {**status, "callback": None}
    assert sent["status"] == "done" and sent["result"]["audio_url"] == f"/api/jobs/{job_id}/audio"

    assert status["callback"]["state"] == "delivered"
    attempts = status["callback"]["attempts"]
    assert [(a["attempt"], a["status_code"], a["outcome"]) for a in attempts] == [
        (1, 500, "retrying"),
        (2, 200, "delivered"),
    ]
    assert attempts[0]["retry_in_s"] == pytest.approx(0.2) and attempts[0]["error"] == "answered 500"


def test_a_callback_to_a_private_address_is_refused_at_submit_and_never_attempted(client, callback_workers):
    farm_redis = redis.Redis.from_url(callback_workers.redis_url)
    records_before = set(farm_redis.scan_iter(match=redis_keys.callback_attempts("*")))
    for url in ("http://10.0.0.1/hook", "http://[::ffff:192.168.0.1]/hook", "http://169.254.169.254/", "http://127.1/"):
        answer = client.post("/api/jobs", json={"text": "Never sent.", "callback_url": url})
        assert answer.status_code == 400, url
        assert answer.get_json()["field"] == "callback_url"
    assert client.get("/api/jobs").get_json()["jobs"] == []
    assert farm_redis.llen(CALLBACK_QUEUE) == 0
    assert set(farm_redis.scan_iter(match=redis_keys.callback_attempts("*"))) == records_before


def test_a_farm_without_a_callback_secret_refuses_a_callback_url(make_app, callback_workers):
    unsigned = make_app(redis_url=callback_workers.redis_url, callback_secret="").test_client()
    answer = unsigned.post("/api/jobs", json={"text": "Unsigned.", "callback_url": "https://example.com/hook"})
    assert answer.status_code == 400
    assert answer.get_json()["field"] == "callback_url" and "CHATTTS_FARM_CALLBACK_SECRET" in answer.get_json()["error"]


def test_the_openapi_description_lists_callback_url_only_where_callbacks_are_sent(make_app, client, callback_workers):
    def job_request_fields(api) -> set[str]:
        operation = api.get("/api/openapi.json").get_json()["paths"]["/api/jobs"]["post"]
        return set(operation["requestBody"]["content"]["application/json"]["schema"]["properties"])

    assert "callback_url" in job_request_fields(client)
    unsigned = make_app(redis_url=callback_workers.redis_url, callback_secret="").test_client()
    assert "callback_url" not in job_request_fields(unsigned)


def test_a_host_name_that_resolves_to_a_private_address_is_refused_at_delivery_without_retries(client, receiver):
    # localhost is a name, taken at submit; it resolves to a loopback address, and only 127.0.0.1 as
    # written is allowed.
    job_id = submit(client, receiver.url("/by-name", host="localhost"))
    status = finished_status(client, job_id)
    assert status["status"] == "done" and status["callback"]["state"] == "failed"
    [attempt] = status["callback"]["attempts"]
    assert attempt["status_code"] is None
    assert attempt["error"].startswith("refused: localhost (resolved to ")
    assert "not a public address" in attempt["error"]
    assert receiver.received == []


def test_a_redirect_is_not_followed_and_counts_as_a_failed_attempt(client, receiver):
    receiver.scripts["/moved"] = [302]
    job_id = submit(client, receiver.url("/moved"))
    status = finished_status(client, job_id)
    assert status["callback"]["state"] == "failed"
    assert [a["status_code"] for a in status["callback"]["attempts"]] == [302] * ATTEMPTS
    assert "redirect: not followed" in status["callback"]["attempts"][0]["error"]
    assert len(receiver.calls("/moved")) == ATTEMPTS
    assert receiver.calls("/redirected-to") == []


def test_a_job_nobody_polls_is_called_back_through_the_reconciler_and_its_row_keeps_the_outcome(app, client, receiver):
    job_id = submit(client, receiver.url("/unpolled"))

    def called_back():
        with app.app_context():
            reconcile.reconcile()
        return receiver.calls("/unpolled")

    [(headers, body)] = wait_for(called_back, "the reconciler to notice the job's end")
    sent = json.loads(body)
    assert sent["id"] == job_id and sent["status"] == "done" and sent["status_url"] == f"/api/jobs/{job_id}"
    assert readme_callback_check()(body, headers[SIGNATURE_HEADER], SECRET)

    # Still nobody polls it: the reconciler's next rounds keep the delivery's outcome in the job's row,
    # before Redis forgets the workers' record of it.
    def settled() -> list | None:
        with app.app_context():
            reconcile.reconcile()
            job = db.session.get(Job, job_id)
            return job.callback_attempts if job.callback_state == CallbackState.DELIVERED else None

    [attempt] = wait_for(settled, "the reconciler to keep the callback's outcome")
    assert attempt["outcome"] == "delivered" and attempt["status_code"] == 200
    redis.Redis.from_url(app.config["SETTINGS"].redis_url).delete(redis_keys.callback_attempts(job_id))
    status = client.get(f"/api/jobs/{job_id}").get_json()
    assert status["callback"] == {"url": receiver.url("/unpolled"), "state": "delivered", "attempts": [attempt]}
    page = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert 'id="fact-callback"' in page and f"to {receiver.url('/unpolled')}" in page


def test_a_status_that_finds_its_delivery_over_keeps_it_in_the_row_and_one_still_retrying_stays_the_workers(app):
    # The workers' record of a delivery, as they write it (worker.callbacks.attempt_delivery); no worker
    # runs here: which rows settle, and when, is the web's alone.
    def attempt(outcome: str) -> dict:
        code, retry_in_s = (200, None) if outcome == "delivered" else (500, 0.2)
        error = None if outcome == "delivered" else "answered 500"
        return {
            "attempt": 1,
            "at": 1.0,
            "status_code": code,
            "error": error,
            "outcome": outcome,
            "retry_in_s": retry_in_s,
        }

    shared = redis.Redis.from_url(app.config["SETTINGS"].redis_url)
    rows = {}
    with app.app_context():
        for outcome in ("delivered", "retrying"):
            rows[outcome] = job_id = str(uuid.uuid4())
            db.session.add(
                Job(
                    id=job_id,
                    text="Called back.",
                    parameters={},
                    format="wav",
                    status=JobStatus.DONE,
                    finished_at=utcnow(),
                    callback_url=f"http://127.0.0.1:9/{outcome}",
                    callback_state=CallbackState.QUEUED,
                )
            )
            shared.rpush(redis_keys.callback_attempts(job_id), json.dumps(attempt(outcome)))
        db.session.commit()
        # The status alone, with no poll's refresh before it (a poll reads the record twice, and a worker
        # may write it in between): what it shows as over is what it keeps.
        for outcome, job_id in rows.items():
            shown = callbacks.delivery(db.session.get(Job, job_id))
            assert shown == {"url": f"http://127.0.0.1:9/{outcome}", "state": outcome, "attempts": [attempt(outcome)]}
            shared.delete(redis_keys.callback_attempts(job_id))
        db.session.expire_all()
        delivered, retrying = (db.session.get(Job, rows[outcome]) for outcome in ("delivered", "retrying"))
        assert (delivered.callback_state, delivered.callback_attempts) == ("delivered", [attempt("delivered")])
        assert (retrying.callback_state, retrying.callback_attempts) == ("queued", None)


def test_a_cancelled_job_is_called_back_cancelled(client, receiver):
    job_id = submit(client, receiver.url("/cancelled"), text="A long text to cancel. " * 20)
    assert client.delete(f"/api/jobs/{job_id}").get_json()["status"] == "cancelled"
    [(_, body)] = wait_for(lambda: receiver.calls("/cancelled"), "the cancelled job's callback")
    sent = json.loads(body)
    assert sent["id"] == job_id and sent["status"] == "cancelled"


def test_a_batch_nobody_polls_is_called_back_once_when_its_last_item_ends_with_its_status(app, client, receiver):
    created = client.post(
        "/api/batches",
        json={
            "callback_url": receiver.url("/batch"),
            "items": [{"text": "The first of two."}, {"text": "The second of two.", "custom_id": "second"}],
        },
    ).get_json()
    assert created["callback"] == {"url": receiver.url("/batch"), "state": "waiting", "attempts": []}

    def called_back():
        with app.app_context():
            reconcile.reconcile()
        return receiver.calls("/batch")

    [(headers, body)] = wait_for(called_back, "the reconciler to notice the batch's end")
    assert readme_callback_check()(body, headers[SIGNATURE_HEADER], SECRET)
    sent = json.loads(body)
    assert sent["id"] == created["id"] and sent["status"] == "done" and sent["progress"] == 1.0
    assert sent["counts"]["done"] == 2 and [item["custom_id"] for item in sent["items"]] == [None, "second"]
    assert sent["callback"]["state"] == "pending"  # as it was when the batch ended
    delivered = wait_for(
        lambda: (status := client.get(created["status_url"]).get_json())["callback"]["state"] == "delivered" and status,
        "the batch's callback to be delivered",
    )
    assert [attempt["status_code"] for attempt in delivered["callback"]["attempts"]] == [200]
    with app.app_context():
        reconcile.reconcile()
    assert len(receiver.calls("/batch")) == 1  # once, however often its end is looked at


def test_a_batchs_callback_url_is_checked_as_a_jobs_is(client):
    refused = client.post(
        "/api/batches", json={"callback_url": "http://10.0.0.1/hook", "items": [{"text": "Never sent."}]}
    )

    assert refused.status_code == 400 and refused.get_json()["field"] == "callback_url"
    assert refused.get_json()["error"].startswith("callback_url: ")
    assert client.get("/api/jobs").get_json()["jobs"] == []


def test_a_celery_callers_job_is_called_back_by_the_worker_with_its_result(callback_workers, receiver):
    sent = callback_workers.client.send_task(
        TASK_NAME, kwargs={"text": "From a Celery caller.", "callback_url": receiver.url("/celery")}
    )
    result = sent.get(timeout=120)
    [(headers, body)] = wait_for(lambda: receiver.calls("/celery"), "the Celery caller's callback")
    assert readme_callback_check()(body, headers[SIGNATURE_HEADER], SECRET)
    assert json.loads(body) == {"id": sent.id, "status": "done", "error": None, "result": result}


def test_the_job_page_shows_how_its_callback_went(watched_page, callback_web_server, receiver):
    receiver.scripts["/page"] = [500, 200]
    answer = requests.post(
        callback_web_server + "/api/jobs",
        json={"text": "Show me the callback.", "callback_url": receiver.url("/page")},
        timeout=30,
    )
    page, problems = watched_page(f"{callback_web_server}/jobs/{answer.json()['id']}")
    # The page polls on after the job is done, while its callback is on its way.
    wait_for(lambda: page.text_content("#fact-callback").startswith("delivered"), "the page to show the delivery")
    assert page.text_content("#fact-callback") == "delivered after 2 attempts"
    assert page.text_content("#job-status") == "done"
    assert problems == []
