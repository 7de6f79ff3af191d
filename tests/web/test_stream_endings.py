"""How a job's stream ends for its listeners: a response ends whole only when the job's audio is whole.

A real `chattts-farm web` (gunicorn) with keys on, on a Redis of the test's own that no worker consumes:
the test plays the worker's side of each streaming job with the contract's own writer
(tests/web/streams.py). A real worker killed mid-stream is in tests/worker/test_tasks.py.
"""

import base64
import json
import threading
import time
from datetime import UTC, datetime

import pytest
import requests

from chattts_farm import redis_keys
from chattts_farm.contract import JobTimeout
from tests.support import wait_until
from tests.web.paused_farm import start_paused_farm
from tests.web.streams import SAMPLE_RATE, StreamWriter, samples
from web.access.api_keys import hash_key

# A client sees a chunked body cut off before its last chunk as this.
CUT_OFF = requests.exceptions.ChunkedEncodingError


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    with start_paused_farm(tmp_path_factory.mktemp("stream-endings"), ("listener",)) as paused:
        yield paused


def streaming_job(farm) -> tuple[str, StreamWriter]:
    job_id = farm.submit_stream("listener")
    return job_id, StreamWriter(farm.redis, job_id)


def listen(farm, job_id: str) -> requests.Response:
    answer = requests.get(
        f"{farm.web.url}/api/jobs/{job_id}/stream?format=pcm", headers=farm.headers("listener"), stream=True, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return answer


def charged_today(farm) -> float:
    """The audio seconds charged to the key today (UTC), as its quota counts them."""
    key_hash = hash_key(farm.keys["listener"])
    return float(farm.redis.get(redis_keys.audio_quota(key_hash, f"{datetime.now(UTC):%Y%m%d}")) or 0)


def test_a_job_failing_mid_stream_cuts_the_audio_response_off(farm):
    job_id, worker = streaming_job(farm)
    worker.audio(samples(0.5))
    with listen(farm, job_id) as answer:
        heard = answer.iter_content(chunk_size=None)
        assert next(heard) == bytes(worker.pcm)
        worker.failed(JobTimeout(f"job {job_id} ran past its time limit"))
        with pytest.raises(CUT_OFF):
            for _ in heard:
                pass


def test_a_job_failing_mid_stream_ends_its_sse_with_an_openai_error_event_and_no_done(farm):
    base, listener = farm.web.url, farm.headers("listener")
    events = []

    def speak():
        body = {
            "model": "tts-1",
            "input": "Spoken until it fails.",
            "voice": 4,
            "stream_format": "sse",
            "response_format": "pcm",
        }
        with requests.post(f"{base}/v1/audio/speech", json=body, headers=listener, stream=True) as answer:
            events.extend(json.loads(line[6:]) for line in answer.iter_lines() if line.startswith(b"data: "))

    caller = threading.Thread(target=speak)
    caller.start()
    job_id = None

    def submitted() -> bool:
        nonlocal job_id
        jobs = requests.get(f"{base}/api/jobs?limit=1", headers=listener).json()["jobs"]
        job_id = jobs[0]["id"] if jobs and jobs[0]["text"] == "Spoken until it fails." else None
        return job_id is not None

    wait_until(submitted, 10, "the speech call's job")
    worker = StreamWriter(farm.redis, job_id)
    worker.audio(samples(0.3))
    worker.failed(JobTimeout(f"job {job_id} ran past its time limit"))
    caller.join(timeout=20)

    *deltas, last = events
    assert [event["type"] for event in deltas] == ["speech.audio.delta"] * len(deltas) and deltas
    assert b"".join(base64.b64decode(event["audio"]) for event in deltas) == bytes(worker.pcm)
    assert last["type"] == "error" and not any(event["type"] == "speech.audio.done" for event in events)
    assert last["error"]["code"] == "job_failed" and "time limit" in last["error"]["message"]


def test_a_cancel_stops_an_open_stream_at_once_and_charges_what_it_sent(farm):
    base, listener = farm.web.url, farm.headers("listener")
    job_id, worker = streaming_job(farm)
    worker.audio(samples(1.0))
    before = charged_today(farm)
    with listen(farm, job_id) as answer:
        heard = answer.iter_content(chunk_size=None)
        received = next(heard)
        assert received == bytes(worker.pcm)
        cancelled = requests.delete(f"{base}/api/jobs/{job_id}", headers=listener)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        started = time.monotonic()
        worker.audio(samples(2.0, seed=1))  # a worker that has not seen the revoke yet goes on
        with pytest.raises(CUT_OFF):
            for piece in heard:
                received += piece
        assert time.monotonic() - started < 2
    assert len(received) == 2 * SAMPLE_RATE  # the one second sent before the cancel, nothing after
    assert charged_today(farm) - before == pytest.approx(1.0)


def test_a_listener_waiting_for_a_cancelled_jobs_first_audio_is_answered_at_once(farm):
    base, listener = farm.web.url, farm.headers("listener")
    job_id, _ = streaming_job(farm)
    waiting = {}

    def wait_for_audio():
        waiting["answer"] = requests.get(f"{base}/api/jobs/{job_id}/stream", headers=listener, timeout=30)

    waiter = threading.Thread(target=wait_for_audio)
    waiter.start()
    time.sleep(0.5)  # the listener is waiting (its job is queued, with no worker to take it)
    assert requests.delete(f"{base}/api/jobs/{job_id}", headers=listener).json()["status"] == "cancelled"
    started = time.monotonic()
    waiter.join(timeout=10)
    assert time.monotonic() - started < 2.5
    assert waiting["answer"].status_code == 409 and "cancelled" in waiting["answer"].json()["error"]
    assert requests.head(f"{base}/api/jobs/{job_id}/stream", headers=listener).status_code == 409  # as its GET


def test_a_rerun_never_adds_to_what_a_listener_heard_of_the_first_run(farm):
    job_id, worker = streaming_job(farm)
    worker.audio(samples(0.5))
    with listen(farm, job_id) as answer:
        heard = answer.iter_content(chunk_size=None)
        received = next(heard)
        # Its worker is lost; another runs the job again from its start.
        worker.rerun("second-run")
        worker.audio(samples(0.3, seed=2))
        with pytest.raises(CUT_OFF):
            for piece in heard:
                received += piece
    assert received == samples(0.5)

    # A listener that comes after the re-run hears the re-run alone, whole.
    with listen(farm, job_id) as answer:
        heard = answer.iter_content(chunk_size=None)
        received = next(heard)
        worker.audio(samples(0.3, seed=3))
        worker.end({"sample_rate": SAMPLE_RATE, "tokens": 10, "duration_s": 0.6})
        received += b"".join(heard)
    assert received == bytes(worker.pcm) == samples(0.3, seed=2) + samples(0.3, seed=3)
