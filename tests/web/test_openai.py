"""The OpenAI-compatible speech endpoint, against real workers."""

import dataclasses
import time

import numpy as np
import pytest

from chattts_farm.contract import OPENAI_VOICE_SEEDS
from tests.support import OPENAI_VOICES
from tests.web.access.support import bearer
from tests.web.api.test_jobs import wait_for
from web.access import api_keys
from web.waiting import WaitSlot
from worker.audio import decode


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
    assert job["voice"] == {"catalog_id": None, "name": None, "seed": OPENAI_VOICE_SEEDS[name], "mix": None}


def test_a_catalog_voice_named_like_an_openai_voice_is_spoken_instead_of_its_seed_on_every_endpoint(client, workers):
    nova = client.post("/api/voices", json={"name": "nova", "seed": 7}).get_json()
    with client.post("/v1/audio/speech", json={"input": "Hello.", "voice": "nova", "response_format": "wav"}) as answer:
        assert answer.status_code == 200
    job = client.post("/api/jobs", json={"text": "Hello.", "voice": "nova"}).get_json()
    (workshop_job,) = client.post("/api/voices/workshop", json={"voices": ["nova"]}).get_json()["jobs"]
    spoken = [answer.headers["X-Job-Id"], job["id"], workshop_job["id"]]
    assert [client.get(f"/api/jobs/{job_id}").get_json()["voice"]["catalog_id"] for job_id in spoken] == [
        nova["id"]
    ] * 3


def test_alloy_on_the_job_api_speaks_as_alloy_on_the_speech_endpoint(client, workers):
    text = "Hello, alloy, from both endpoints."
    with client.post("/v1/audio/speech", json={"input": text, "voice": "alloy", "response_format": "wav"}) as answer:
        assert answer.status_code == 200
    spoken = wait_for(client, answer.headers["X-Job-Id"], {"done"})
    # The speech endpoint draws a random audio seed and streams its job: the job asks for the same of both.
    seed = spoken["result"]["seed"]
    submitted = client.post("/api/jobs", json={"text": text, "voice": "alloy", "seed": seed, "stream": True})
    assert submitted.status_code == 202
    job = wait_for(client, submitted.get_json()["id"], {"done"})
    other = client.post("/api/jobs", json={"text": text, "voice": "nova", "seed": seed, "stream": True})
    other_voice = wait_for(client, other.get_json()["id"], {"done"})

    assert job["voice"] == spoken["voice"] == {"catalog_id": None, "name": None, "seed": 390_000_000, "mix": None}
    samples = [decode(client.get(done["audio_url"]).data)[0] for done in (spoken, job, other_voice)]
    # Equal up to the float rounding batch mates bring (as tests/worker/engine_process/test_pipeline.py allows).
    np.testing.assert_allclose(samples[1], samples[0], atol=2e-3)
    assert samples[2].shape != samples[0].shape or not np.allclose(samples[2], samples[0], atol=1e-3)


def test_a_kokoro_blend_on_the_speech_endpoint_speaks_as_the_same_blend_on_the_job_api(client, workers):
    text = "Hello, alloy and nova, from both endpoints."
    with client.post(
        "/v1/audio/speech", json={"input": text, "voice": "alloy(2)+nova(1)", "response_format": "wav"}
    ) as answer:
        assert answer.status_code == 200
    spoken = wait_for(client, answer.headers["X-Job-Id"], {"done"})
    mix = [{"voice": "alloy", "weight": 2}, {"voice": "nova", "weight": 1}]
    seed = spoken["result"]["seed"]
    submitted = client.post("/api/jobs", json={"text": text, "voice": {"mix": mix}, "seed": seed, "stream": True})
    job = wait_for(client, submitted.get_json()["id"], {"done"})

    parts = [
        {"voice": OPENAI_VOICE_SEEDS["alloy"], "weight": 2.0},
        {"voice": OPENAI_VOICE_SEEDS["nova"], "weight": 1.0},
    ]
    assert spoken["voice"]["mix"] == job["voice"]["mix"] == parts
    samples = [decode(client.get(done["audio_url"]).data)[0] for done in (spoken, job)]
    np.testing.assert_allclose(samples[1], samples[0], atol=2e-3)


def test_a_kokoro_blend_without_weights_is_equal_parts_and_a_catalog_voice_of_its_name_is_spoken_instead(
    client, workers
):
    def voice_of_speech():
        body = {"input": "Hi.", "voice": "alloy+nova", "response_format": "wav"}
        with client.post("/v1/audio/speech", json=body) as answer:
            assert answer.status_code == 200
        return client.get(f"/api/jobs/{answer.headers['X-Job-Id']}").get_json()["voice"]

    assert [part["weight"] for part in voice_of_speech()["mix"]] == [1.0, 1.0]
    named = client.post("/api/voices", json={"name": "alloy+nova", "seed": 3}).get_json()
    assert voice_of_speech() == {"catalog_id": named["id"], "name": "alloy+nova", "seed": None, "mix": None}


@pytest.mark.parametrize(
    ("voice", "status", "why"),
    [
        ("alloy(-1)+nova", 400, "part 1 of the blend: weight: must be between 0"),
        ("alloy(0)+nova(0)", 400, "a weight above 0"),
        ("alloy+nobody", 422, "'nobody' is neither an OpenAI voice name"),
        ("+".join(["alloy"] * 9), 400, "with 1 to 8 voices"),
    ],
)
def test_a_kokoro_blend_that_mixes_no_voices_is_refused_naming_the_voice(client, voice, status, why):
    answer = client.post("/v1/audio/speech", json={"input": "Hi.", "voice": voice})
    assert answer.status_code == status and answer.get_json()["field"] == "voice"
    assert why in answer.get_json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/jobs", {"text": "Hi.", "voice": "Alloy"}, "voice"),
        ("/v1/audio/speech", {"input": "Hi.", "voice": "Alloy"}, "voice"),
        ("/api/voices/workshop", {"voices": ["alloy", "Alloy"]}, "voices"),
    ],
)
def test_a_name_neither_openai_nor_the_catalog_knows_is_refused_naming_the_voice_on_every_endpoint(
    client, path, body, field
):
    answer = client.post(path, json=body)
    assert answer.status_code == 422 and answer.get_json()["field"] == field
    assert "OpenAI voice name (alloy, ash," in answer.get_json()["error"]
    assert client.get("/api/jobs").get_json()["jobs"] == []  # nothing was submitted


def test_the_voice_list_has_openai_names_then_the_catalogs_each_once(client):
    client.post("/api/voices", json={"name": "Night reader", "spk_emb": "蘁淰敕欀" * 8})
    client.post("/api/voices", json={"name": "echo", "spk_emb": "蘁淰敕欀" * 8})  # keys off: anyone may

    answer = client.get("/v1/audio/voices")

    assert answer.status_code == 200
    # Kokoro-FastAPI's shape, which Open WebUI reads: id is what to send as voice.
    assert answer.get_json()["voices"] == [{"id": name, "name": name} for name in (*OPENAI_VOICES, "Night reader")]


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
