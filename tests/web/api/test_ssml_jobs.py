"""SSML through the web and real workers (synthetic-tiny): a document's breaks are exact silences in the
stored and the streamed audio, its <p> and <s> are segment boundaries in the timeline and the captions,
a <prosody rate> is its segment's speed, <sub> and <say-as> change what is said; a document outside the
subset is a 400 naming the text, on the job API and the OpenAI-compatible endpoint alike."""

import numpy as np
import pytest

from chattts_farm.speech_length import expected_tokens
from tests.web.api.test_job_captions import PAUSE_S, assert_silences, pcm, timestamp
from tests.web.api.test_jobs import wait_for

DOCUMENT = (
    "<speak><p>The first paragraph is one segment.</p>"
    '<break time="1.2s"/>'
    '<p><s>A short sentence.</s><s><prosody rate="x-slow">Then a slow one.</prosody></s></p>'
    '<break strength="x-strong"/><sub alias="World Wide Web Consortium">W3C</sub> has '
    '<say-as interpret-as="cardinal">42</say-as> members.<break time="500ms"/></speak>'
)
CAPTIONS = [
    "The first paragraph is one segment.",
    "A short sentence.",
    "Then a slow one.",
    "World Wide Web Consortium has forty-two members.",
]
# Before each segment, and after the last: a break's length, or the usual pause at a <p> or <s> boundary.
SILENCES_S = [0.0, 1.2, PAUSE_S, 1.25, 0.5]


def test_a_documents_breaks_are_silences_of_their_length_in_the_audio_between_its_segments(client, workers):
    answer = client.post("/api/jobs", json={"text": DOCUMENT, "seed": 5})
    assert answer.status_code == 202, answer.get_json()
    job = wait_for(client, answer.get_json()["id"], {"done"})
    result = job["result"]
    assert job["text"] == DOCUMENT  # kept as it was written
    assert [entry["text"] for entry in result["timeline"]] == CAPTIONS
    samples = pcm(client.get(result["audio_url"]).data)
    assert len(samples) / 24_000 == pytest.approx(result["duration_s"], abs=0.0006)
    assert_silences(samples, result["timeline"], SILENCES_S)


def test_a_prosody_rate_is_the_speed_of_the_segment_inside_it_alone(client, workers):
    job_id = client.post("/api/jobs", json={"text": DOCUMENT, "speed": 6}).get_json()["id"]
    segments = wait_for(client, job_id, {"done"})["result"]["quality"]["segments"]
    # synthetic-tiny speaks exactly the tokens expected of a text at its speed.
    assert segments[2]["tokens"] == expected_tokens("Then a slow one.", 1) > expected_tokens("Then a slow one.", 6)
    assert segments[1]["tokens"] == expected_tokens("A short sentence.", 6)


def test_the_captions_of_a_document_put_each_segment_after_its_break(client, workers):
    job_id = client.post("/api/jobs", json={"text": DOCUMENT}).get_json()["id"]
    timeline = wait_for(client, job_id, {"done"})["result"]["timeline"]
    vtt = client.get(f"/api/jobs/{job_id}/captions").text
    assert [line for line in vtt.splitlines() if " --> " in line] == [
        f"{timestamp(entry['start_s'], '.')} --> {timestamp(entry['end_s'], '.')}" for entry in timeline
    ]
    assert timeline[1]["start_s"] - timeline[0]["end_s"] == pytest.approx(1.2, abs=0.0011)
    assert all(caption in vtt for caption in CAPTIONS)


def test_a_streamed_document_sends_its_silences_as_they_come(client, workers):
    job_id = client.post("/api/jobs", json={"text": DOCUMENT, "stream": True}).get_json()["id"]
    streamed = client.get(f"/api/jobs/{job_id}/stream?format=pcm")
    assert streamed.status_code == 200
    samples = np.frombuffer(streamed.data, dtype="<i2")
    result = wait_for(client, job_id, {"done"})["result"]
    assert_silences(samples, result["timeline"], SILENCES_S)
    assert np.array_equal(samples, pcm(client.get(result["audio_url"]).data))


def test_the_openai_endpoint_speaks_a_document_and_refuses_a_bad_one_naming_its_input(client, workers):
    spoken = client.post("/v1/audio/speech", json={"input": DOCUMENT, "voice": 3, "response_format": "pcm"})
    assert spoken.status_code == 200
    samples = np.frombuffer(spoken.data, dtype="<i2")
    result = wait_for(client, spoken.headers["X-Job-Id"], {"done"})["result"]
    assert_silences(samples, result["timeline"], SILENCES_S)
    refused = client.post("/v1/audio/speech", json={"input": '<speak><voice name="x">Hi.</voice></speak>', "voice": 3})
    assert refused.status_code == 400 and refused.get_json()["field"] == "input"
    assert "holds <voice>" in refused.get_json()["error"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('<speak>Listen. <audio src="https://example.com/a.wav"/></speak>', "holds <audio>"),
        ('<!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>', "holds a DTD"),
        ("<speak>Wait." + '<break time="10s"/>' * 7 + "</speak>", "add up to more than 60 s"),
        ('Hello <break time="1s"/> world.', "no SSML document"),
    ],
)
def test_a_document_outside_the_subset_is_a_400_naming_the_text_and_makes_no_job(client, text, why):
    before = job_ids(client)
    answer = client.post("/api/jobs", json={"text": text})
    assert answer.status_code == 400 and answer.get_json()["field"] == "text" and why in answer.get_json()["error"]
    assert job_ids(client) == before


def job_ids(client) -> set[str]:
    return {job["id"] for job in client.get("/api/jobs?limit=500").get_json()["jobs"]}
