"""Audio as it is made, over HTTP: ``GET /api/jobs/<id>/stream`` and the streaming ``/v1/audio/speech``,
through a real gunicorn web server and real workers."""

import base64
import io
import json
import time
import wave

import numpy as np
import openai
import pytest
import redis
import requests

from chattts_farm import redis_keys
from tests.support import serve_web
from worker.audio import decode

LONG_TEXT = " ".join(f"Sentence {word} of a text that streams while it is spoken." for word in "abcdefghijklmnop")


@pytest.fixture(scope="module")
def web(workers, data_dir, tmp_path_factory):
    for base, _ in serve_web(workers, data_dir, tmp_path_factory.mktemp("stream-web") / "farm.db"):
        yield base


def stored_pcm(audio_store, job_id) -> bytes:
    """The 16-bit samples of a finished job's stored WAV."""
    with audio_store.open(audio_store.key(job_id, "wav")) as audio, wave.open(io.BytesIO(audio.read())) as stored:
        return stored.readframes(stored.getnframes())


def submit(web, **arguments) -> str:
    answer = requests.post(f"{web}/api/jobs", json={"voice": 5, **arguments}, timeout=30)
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def test_a_streaming_job_plays_from_its_first_chunk_and_joined_it_is_the_stored_audio(web, audio_store):
    job_id = submit(web, text=LONG_TEXT, stream=True)
    with requests.get(f"{web}/api/jobs/{job_id}/stream", stream=True, timeout=120) as answer:
        assert answer.status_code == 200 and answer.headers["Content-Type"] == "audio/wav"
        assert answer.headers.get("Content-Length") is None  # sent as it comes
        chunks = answer.iter_content(chunk_size=None)
        first = next(chunks)
        while len(first) <= 44:  # the header may come alone
            first += next(chunks)
        status_at_first_audio = requests.get(f"{web}/api/jobs/{job_id}", timeout=10).json()["status"]
        body = first + b"".join(chunks)
    assert status_at_first_audio != "done"
    assert body[:4] == b"RIFF" and body.count(b"RIFF") == 1 and body[36:40] == b"data"
    assert body[44:] == stored_pcm(audio_store, job_id)


def test_a_stream_read_after_the_job_is_done_is_the_whole_audio_from_the_start(web, audio_store):
    job_id = submit(web, text="Read me later.", stream=True)
    deadline = time.monotonic() + 60
    while requests.get(f"{web}/api/jobs/{job_id}", timeout=10).json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    answer = requests.get(f"{web}/api/jobs/{job_id}/stream?format=pcm", timeout=60)
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "audio/pcm"
    assert answer.headers["X-Sample-Rate"] == "24000"
    assert answer.content == stored_pcm(audio_store, job_id)


def test_a_job_submitted_without_stream_is_served_whole_once_done(web, audio_store):
    job_id = submit(web, text="No stream asked for.")
    answer = requests.get(f"{web}/api/jobs/{job_id}/stream?format=pcm", timeout=60)
    assert answer.status_code == 200 and answer.content == stored_pcm(audio_store, job_id)
    # Once done, gunicorn serves a byte range of the stored file: a player seeks, a download resumes.
    with audio_store.open(audio_store.key(job_id, "wav")) as audio:
        whole = audio.read()
    part = requests.get(f"{web}/api/jobs/{job_id}/audio", headers={"Range": "bytes=44-1043"}, timeout=30)
    assert part.status_code == 206 and part.content == whole[44:1044]
    assert part.headers["Content-Range"] == f"bytes 44-1043/{len(whole)}"


@pytest.mark.parametrize(("audio_format", "mime_type"), [("mp3", "audio/mpeg"), ("ogg", "audio/ogg")])
def test_a_stream_is_encoded_as_it_comes_in_a_compressed_format(web, audio_store, audio_format, mime_type):
    job_id = submit(web, text=LONG_TEXT, stream=True)
    with requests.get(f"{web}/api/jobs/{job_id}/stream?format={audio_format}", stream=True, timeout=120) as answer:
        assert answer.status_code == 200 and answer.headers["Content-Type"] == mime_type
        pieces = list(answer.iter_content(chunk_size=None))
    assert len(pieces) > 1
    samples, rate = decode(b"".join(pieces))
    stored = len(stored_pcm(audio_store, job_id)) // 2
    assert rate == 24_000 and abs(samples.size - stored) < 0.1 * rate  # lossy: a frame or two of padding


def test_a_cancelled_job_answers_with_a_json_error(make_app, idle_redis_url):
    # No worker reads this Redis database: the job is still queued when it is cancelled, never done first.
    client = make_app(redis_url=idle_redis_url).test_client()
    job_id = client.post("/api/jobs", json={"text": "Never spoken.", "stream": True}).get_json()["id"]
    assert client.delete(f"/api/jobs/{job_id}").get_json()["status"] == "cancelled"
    answer = client.get(f"/api/jobs/{job_id}/stream")
    assert answer.status_code == 409 and "cancelled" in answer.get_json()["error"]


def test_an_unknown_job_is_404_and_a_bad_format_400_naming_it(web):
    job_id = submit(web, text="Hi.", stream=True)
    assert requests.get(f"{web}/api/jobs/no-such-job/stream", timeout=10).status_code == 404
    bad = requests.get(f"{web}/api/jobs/{job_id}/stream?format=aac", timeout=10)
    assert bad.status_code == 400 and bad.json()["field"] == "format"


def test_bad_stream_flags_are_refused_naming_the_field(web):
    answer = requests.post(f"{web}/api/jobs", json={"text": "Hi.", "stream": "yes"}, timeout=10)
    assert answer.status_code == 400 and answer.json()["field"] == "stream"
    speech = requests.post(
        f"{web}/v1/audio/speech", json={"input": "Hi.", "voice": "1", "stream_format": "chunks"}, timeout=10
    )
    assert speech.status_code == 400 and speech.json()["field"] == "stream_format"


def test_the_openai_sdk_streams_pcm_and_gets_mp3(web):
    client = openai.OpenAI(base_url=f"{web}/v1", api_key="unused")
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="7", input=LONG_TEXT, response_format="pcm"
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        pieces = list(response.iter_bytes())
    pcm = b"".join(pieces)
    assert len(pieces) > 1 and len(pcm) % 2 == 0 and np.abs(np.frombuffer(pcm, "<i2")).max() > 0
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="7", input="Whole.", response_format="mp3"
    ) as response:
        assert response.headers["content-type"] == "audio/mpeg" and len(response.read()) > 100


def test_the_openai_sdk_reads_sse_audio_deltas_then_done(web, audio_store):
    client = openai.OpenAI(base_url=f"{web}/v1", api_key="unused")
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="7", input=LONG_TEXT, response_format="pcm", stream_format="sse"
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        job_id = response.headers["x-job-id"]
        events = [json.loads(line[len("data: ") :]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas, done = events[:-1], events[-1]
    assert len(deltas) > 1 and all(event["type"] == "speech.audio.delta" for event in deltas)
    assert done["type"] == "speech.audio.done" and done["usage"]["output_tokens"] > 0
    pcm = b"".join(base64.b64decode(event["audio"]) for event in deltas)
    assert pcm == stored_pcm(audio_store, job_id)


def test_a_client_that_hangs_up_a_stream_gives_its_wait_slot_back(web, workers):
    waits = redis.Redis.from_url(workers.redis_url)
    with requests.post(
        f"{web}/v1/audio/speech",
        json={"input": LONG_TEXT, "voice": "3", "response_format": "pcm"},
        stream=True,
        timeout=60,
    ) as answer:
        next(answer.iter_content(chunk_size=None))
        assert waits.zcard(redis_keys.wait_slots("anonymous")) == 1
    deadline = time.monotonic() + 10
    while waits.zcard(redis_keys.wait_slots("anonymous")):
        assert time.monotonic() < deadline, "the slot of a stream whose client hung up was not given back"
        time.sleep(0.1)
