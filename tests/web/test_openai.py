"""The OpenAI-compatible speech endpoint, against real workers."""

import dataclasses
import time

import numpy as np
import pytest

from tests.web.access.support import bearer
from web.access import api_keys
from web.openai import chattts_speed
from web.voices import OPENAI_VOICE_SEEDS
from web.waiting import WaitSlot
from worker.audio import decode

# The voices OpenAI's API reference lists for /v1/audio/speech, as its SDK's examples send them.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse")


@pytest.mark.parametrize(
    ("response_format", "mime_type"),
    [("mp3", "audio/mpeg"), ("opus", "audio/ogg"), ("flac", "audio/flac"), ("wav", "audio/wav")],
)
def test_speech_returns_decodable_audio(client, workers, response_format, mime_type):
    answer = client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "input": "Hello, OpenAI client.", "voice": 42, "response_format": response_format},
    )
    assert answer.status_code == 200 and answer.mimetype == mime_type
    samples, rate = decode(answer.data)
    assert rate == 24_000 and len(samples) > rate // 2
    # The stream's last entry is written just before the task stores its result: the job is done a moment after.
    job_url = f"/api/jobs/{answer.headers['X-Job-Id']}"
    deadline = time.monotonic() + 10
    while client.get(job_url).get_json()["status"] != "done":
        assert time.monotonic() < deadline, "the job whose audio was all sent never became done"
        time.sleep(0.05)


def test_pcm_is_raw_16_bit_samples(client, workers):
    answer = client.post("/v1/audio/speech", json={"input": "Raw samples.", "voice": 3, "response_format": "pcm"})
    assert answer.status_code == 200 and answer.mimetype == "audio/pcm"
    samples = np.frombuffer(answer.data, dtype="<i2")
    assert samples.size > 12_000 and np.abs(samples).max() > 0


@pytest.mark.parametrize("name", OPENAI_VOICES)
def test_each_openai_voice_name_speaks_its_own_fixed_seed(client, workers, name):
    # Closed unread: its wait slot is given back.
    with client.post("/v1/audio/speech", json={"input": "Hello.", "voice": name, "response_format": "wav"}) as answer:
        assert answer.status_code == 200
    job = client.get(f"/api/jobs/{answer.headers['X-Job-Id']}").get_json()
    assert job["voice"] == {"catalog_id": None, "name": None, "seed": OPENAI_VOICE_SEEDS[name]}


def test_the_openai_voices_are_distinct_seeds():
    assert len(set(OPENAI_VOICE_SEEDS.values())) == len(OPENAI_VOICE_SEEDS)


def test_a_catalog_voice_named_like_an_openai_voice_is_spoken_instead_of_its_seed(client, workers):
    nova = client.post("/api/voices", json={"name": "nova", "seed": 7}).get_json()
    with client.post("/v1/audio/speech", json={"input": "Hello.", "voice": "nova", "response_format": "wav"}) as answer:
        assert answer.status_code == 200
    assert client.get(f"/api/jobs/{answer.headers['X-Job-Id']}").get_json()["voice"]["catalog_id"] == nova["id"]


def test_openai_voice_names_are_no_voices_to_the_job_api(client):
    answer = client.post("/api/jobs", json={"text": "Hi.", "voice": "alloy"})
    assert answer.status_code == 422 and answer.get_json()["field"] == "voice"


def test_speed_maps_onto_chattts_levels():
    assert [chattts_speed(s) for s in (0.25, 0.5, 1.0, 2.0, 4.0)] == [1, 3, 5, 7, 9]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"input": "Hi.", "voice": 1, "response_format": "aac"}, 400, "response_format"),
        ({"input": "Hi.", "voice": 1, "response_format": "ogg-vorbis"}, 400, "response_format"),
        ({"input": "Hi.", "voice": 1, "speed": 5}, 400, "speed"),
        ({"input": "", "voice": 1}, 400, "input"),
        ({"voice": 1}, 400, "input"),
        ({"input": "Hi.", "voice": "nobody"}, 422, "voice"),
        ({"input": "Hi.", "voice": "Alloy"}, 422, "voice"),  # OpenAI's names are lower-case, as its API takes them
        ({"input": "Hi."}, 400, "voice"),
    ],
)
def test_bad_requests_are_4xx_naming_the_field(client, body, status, field):
    answer = client.post("/v1/audio/speech", json=body)
    assert answer.status_code == status and answer.get_json()["field"] == field


def test_with_keys_off_every_caller_shares_one_bound_of_waits(app, client):
    app.config["SETTINGS"] = dataclasses.replace(app.config["SETTINGS"], max_waits_per_key=1)
    with app.test_request_context(), WaitSlot.take():  # another anonymous caller, waiting for its audio
        answer = client.post("/v1/audio/speech", json={"input": "Hi.", "voice": 1})
    assert answer.status_code == 429 and "keys are off" in answer.get_json()["error"]
    assert int(answer.headers["Retry-After"]) >= 1
    # Refused before anything was submitted.
    assert client.get("/api/jobs").get_json()["jobs"] == []


def test_only_an_admin_key_may_give_a_catalog_voice_an_openai_voice_name(make_app):
    app = make_app(require_api_key=True)
    with app.app_context():
        user, admin = api_keys.create_key("user"), api_keys.create_key("operator", admin=True)
    client = app.test_client()
    embedding = "蘁淰敕欀" * 8
    mine = client.post("/api/voices", json={"name": "my voice", "spk_emb": embedding}, headers=bearer(user))
    refused = [
        client.post("/api/voices", json={"name": "alloy", "spk_emb": embedding}, headers=bearer(user)),
        client.patch(f"/api/voices/{mine.get_json()['id']}", json={"name": " nova "}, headers=bearer(user)),
        client.post("/api/voices/import", json=[{"name": "echo", "spk_emb": embedding}], headers=bearer(user)),
    ]
    assert [(answer.status_code, answer.get_json()["field"]) for answer in refused] == [(403, "name")] * 3
    given = client.post("/api/voices", json={"name": "alloy", "spk_emb": embedding}, headers=bearer(admin))
    assert given.status_code == 201
    # A name that only looks like one is anyone's: OpenAI's names are lower-case, as its API takes them.
    look_alike = client.post("/api/voices", json={"name": "Alloy", "spk_emb": embedding}, headers=bearer(user))
    assert look_alike.status_code == 201
