"""Blends of voices on the job API, the catalog and the workshop, against real CPU workers (synthetic-tiny)."""

import numpy as np
import pytest

from chattts_farm.contract import MAX_MIX_PARTS
from tests.voice_bombs import embedding_text
from tests.web.api.test_jobs import wait_for
from worker.audio import decode

TEXT = "Hello from a blend of voices."


def spoken(client, voice, seed=5):
    """The samples of a finished job speaking ``TEXT`` in ``voice`` with this audio seed, and the job."""
    answer = client.post("/api/jobs", json={"text": TEXT, "voice": voice, "seed": seed})
    assert answer.status_code == 202, answer.get_json()
    job = wait_for(client, answer.get_json()["id"], {"done"})
    return decode(client.get(job["audio_url"]).data)[0], job


def assert_differ(samples, other):
    assert samples.shape != other.shape or not np.allclose(samples, other, atol=1e-3)


@pytest.mark.database  # the job's blend is kept in its row, on SQLite and on PostgreSQL
def test_a_stored_blend_speaks_as_the_same_blend_given_ad_hoc_and_as_neither_of_its_voices(client, workers):
    client.post("/api/voices", json={"name": "calm", "seed": 9})
    mix = [{"voice": "calm", "weight": 0.7}, {"voice": 42, "weight": 0.3}]
    stored = client.post("/api/voices", json={"name": "calm and 42", "mix": mix, "tags": ["blend"]})
    assert stored.status_code == 201, stored.get_json()
    assert stored.get_json()["seed"] is None and len(stored.get_json()["spk_emb"]) > 16

    ad_hoc, ad_hoc_job = spoken(client, {"mix": mix})
    by_name, _ = spoken(client, "calm and 42")
    # Equal up to the float rounding batch mates bring (as tests/worker/engine_process/test_pipeline.py allows).
    np.testing.assert_allclose(by_name, ad_hoc, atol=2e-3)
    for part in ("calm", 42):
        assert_differ(ad_hoc, spoken(client, part)[0])
    assert [part["weight"] for part in ad_hoc_job["voice"]["mix"]] == [0.7, 0.3]
    # The ad hoc job's voice, kept, is the stored blend's embedding.
    kept = client.post(f"/api/voices/from-job/{ad_hoc_job['id']}", json={"name": "kept blend"}).get_json()
    assert kept["spk_emb"] == stored.get_json()["spk_emb"]


def test_the_workshop_speaks_a_blend_among_the_voices_it_is_given(client, workers):
    mix = {"mix": [{"voice": "alloy"}, {"voice": "nova"}]}
    answer = client.post("/api/voices/workshop", json={"text": TEXT, "voices": ["alloy", mix]})
    assert answer.status_code == 202, answer.get_json()
    alloy, blend = (wait_for(client, job["id"], {"done"}) for job in answer.get_json()["jobs"])
    assert alloy["voice"]["mix"] is None and [part["weight"] for part in blend["voice"]["mix"]] == [1.0, 1.0]


MIXES_REFUSED = {
    "a negative weight": ([{"voice": 1, "weight": -0.5}, {"voice": 2, "weight": 1}], 400, "weight: must be between 0"),
    "all weights 0": ([{"voice": 1, "weight": 0}, {"voice": "alloy", "weight": 0}], 400, "a weight above 0"),
    "a voice nobody knows": ([{"voice": 1}, {"voice": "nobody"}], 422, "'nobody' is neither an OpenAI voice name"),
    "too many voices": ([{"voice": seed} for seed in range(MAX_MIX_PARTS + 1)], 400, "with 1 to 8 voices"),
    "a blend in a blend": ([{"voice": 1}, {"voice": {"mix": [{"voice": 2}]}}], 400, "one seed or embedding voice"),
}


@pytest.mark.parametrize(("mix", "status", "why"), MIXES_REFUSED.values(), ids=MIXES_REFUSED)
def test_a_blend_that_mixes_no_voices_is_refused_naming_the_voice_and_records_nothing(client, mix, status, why):
    refusals = [
        client.post("/api/jobs", json={"text": TEXT, "voice": {"mix": mix}}),
        client.post("/api/voices/workshop", json={"voices": [{"mix": mix}]}),
        client.post("/api/voices", json={"name": "refused", "mix": mix}),
    ]
    assert [(answer.status_code, answer.get_json()["field"]) for answer in refusals] == [
        (status, "voice"),
        (status, "voices"),
        (status, "mix"),
    ]
    assert all(why in answer.get_json()["error"] for answer in refusals)
    assert client.get("/api/jobs").get_json()["jobs"] == [] and client.get("/api/voices").get_json()["voices"] == []


def test_a_blend_the_worker_cannot_mix_is_not_kept_and_is_refused_naming_the_mix(client, workers):
    # Embedding text of 32 values: the contract takes it, the model (64 wide) does not.
    narrow = embedding_text(np.random.default_rng(0).standard_normal(32).astype(np.float16).tobytes())
    answer = client.post("/api/voices", json={"name": "too narrow", "mix": [{"voice": 1}, {"voice": narrow}]})
    assert answer.status_code == 400 and answer.get_json()["field"] == "mix"
    assert "the speaker embedding has 32 values" in answer.get_json()["error"]
    assert client.get("/api/voices").get_json()["voices"] == []
