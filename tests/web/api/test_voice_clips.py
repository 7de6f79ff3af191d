"""Voices from reference clips: uploaded to the catalog as a form, checked by the web, encoded by a real CPU
worker (synthetic-tiny) into ChatTTS's speaker sample, and spoken by jobs."""

import io
import struct
import time

import numpy as np
import pytest
import soundfile

from tests.web.api.test_jobs import wait_for
from worker.audio import decode

TEXT = "Hello from a voice of my own."
TRANSCRIPT = "This is how I sound when I read aloud."
# With keys off, a form must carry this header: no cross-site form can send one (any value does).
FORM_HEADERS = {"X-CSRF-Token": "test"}
# A clip is refused from what its header or its first seconds say: well within this.
FAST_S = 2.0


def clip(seconds=3.0, rate=22_050, channels=1, container="WAV", codec="PCM_16", seed=0) -> bytes:
    """A clip of noise (synthetic weights hear no words), encoded as a file of ``container``."""
    rng = np.random.default_rng(seed)
    samples = (rng.standard_normal((int(seconds * rate), channels)) * 0.1).astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=container, subtype=codec)
    return buffer.getvalue()


def upload(client, audio: bytes | None, name="my voice", transcript=TRANSCRIPT, filename="clip.wav", **fields):
    form = {"name": name, "tags": "mine, Clip", **fields}
    if transcript is not None:
        form["transcript"] = transcript
    if audio is not None:
        form["audio"] = (io.BytesIO(audio), filename)
    return client.post("/api/voices", data=form, content_type="multipart/form-data", headers=FORM_HEADERS)


def spoken(client, voice, seed=5):
    answer = client.post("/api/jobs", json={"text": TEXT, "voice": voice, "seed": seed})
    assert answer.status_code == 202, answer.get_json()
    job = wait_for(client, answer.get_json()["id"], {"done"})
    return decode(client.get(job["audio_url"]).data)[0]


@pytest.mark.database  # the clip's sample is kept in the voice's row, and a job's in its own
def test_a_voice_from_a_clip_speaks_alike_for_a_voice_and_seed_and_unlike_a_seed_voice(client, workers):
    made = upload(client, clip(seconds=2.5))
    assert made.status_code == 201, made.get_json()
    voice = made.get_json()
    assert voice["kind"] == "clip" and voice["txt_smp"] == TRANSCRIPT and voice["tags"] == ["clip", "mine"]
    assert voice["spk_emb"] is None and voice["seed"] is None and len(voice["spk_smp"]) > 16

    first = spoken(client, "my voice")
    np.testing.assert_array_equal(spoken(client, "my voice"), first)
    np.testing.assert_array_equal(spoken(client, "my voice"), spoken(client, "my voice"))
    by_id = client.post("/api/jobs", json={"text": TEXT, "voice_id": voice["id"], "seed": 5}).get_json()
    by_id = wait_for(client, by_id["id"], {"done"})
    np.testing.assert_array_equal(decode(client.get(by_id["audio_url"]).data)[0], first)
    seeded = spoken(client, 42)
    assert seeded.shape != first.shape or not np.allclose(seeded, first, atol=1e-3)
    other = upload(client, clip(seconds=2.5, seed=1), name="another voice").get_json()
    assert other["spk_smp"] != voice["spk_smp"]


@pytest.mark.parametrize(
    "container, codec, filename",
    [("FLAC", "PCM_16", "clip.flac"), ("OGG", "OPUS", "clip.opus"), ("MP3", "MPEG_LAYER_III", "clip.mp3")],
)
def test_a_clip_may_be_flac_ogg_opus_or_mp3_and_stereo_at_any_common_rate(client, workers, container, codec, filename):
    rate = 48_000 if container == "OGG" else 44_100
    made = upload(client, clip(rate=rate, channels=2, container=container, codec=codec), filename=filename)
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["kind"] == "clip"


def lying_wav(seconds_claimed: float, seconds_present: float, rate=16_000) -> bytes:
    """A 16-bit mono WAV whose data chunk claims more samples than the file holds."""
    whole = clip(seconds=seconds_present, rate=rate)
    data_at = whole.index(b"data")
    claimed = int(seconds_claimed * rate) * 2
    return whole[: data_at + 4] + struct.pack("<I", claimed) + whole[data_at + 8 :]


BAD_CLIPS = {
    "random bytes": (lambda: np.random.default_rng(3).bytes(50_000), 400, "not a sound file"),
    "a header that lies about its length": (lambda: lying_wav(20.0, 2.0), 400, "claims"),
    "40 seconds": (lambda: clip(seconds=40, rate=8_000), 400, "at most 30 s"),
    # An MP3 has no length of its own to trust: it is decoded, never past 31 s.
    "40 seconds of MP3": (lambda: clip(seconds=40, rate=16_000, container="MP3", codec="MPEG_LAYER_III"), 400, "30 s"),
    "half a second": (lambda: clip(seconds=0.5), 400, "at least 1 s"),
    "three channels": (lambda: clip(channels=3), 400, "3 channels"),
    "not WAV, FLAC, Ogg or MP3": (lambda: clip(container="AIFF"), 400, "WAV, FLAC, Ogg or MP3"),
    "an empty file": (lambda: b"", 400, "empty"),
    "more than 10 MB": (lambda: clip(seconds=25, rate=96_000, channels=2, codec="PCM_24"), 413, "at most 10 MB"),
}


@pytest.mark.parametrize("make_clip, status, message", BAD_CLIPS.values(), ids=BAD_CLIPS.keys())
def test_a_bad_clip_is_refused_fast_naming_audio_and_no_voice_is_made(client, make_clip, status, message):
    audio = make_clip()
    started = time.monotonic()
    answer = upload(client, audio)
    assert time.monotonic() - started < FAST_S
    assert answer.status_code == status, answer.get_json()
    assert answer.get_json()["field"] == "audio" and message in answer.get_json()["error"]
    assert client.get("/api/voices").get_json()["voices"] == []


def test_a_file_a_byte_past_10_mb_is_refused_naming_audio_though_the_form_is_within_its_limit(client):
    answer = upload(client, b"\0" * (10_000_000 + 1))
    assert answer.status_code == 413 and answer.get_json()["field"] == "audio"


@pytest.mark.parametrize("transcript", [None, "", "   ", "[Stts][spk_emb]"], ids=["missing", "empty", "blank", "tags"])
def test_a_clip_without_its_words_is_refused_naming_transcript(client, transcript):
    answer = upload(client, clip(), transcript=transcript)
    assert answer.status_code == 400 and answer.get_json()["field"] == "transcript"


def test_a_form_without_a_clip_is_refused_naming_audio(client):
    answer = upload(client, None)
    assert answer.status_code == 400 and answer.get_json()["field"] == "audio"


def test_with_keys_off_a_form_without_the_csrf_header_is_refused_as_a_cross_site_form_could_send_it(client):
    form = {"name": "forged", "transcript": TRANSCRIPT, "audio": (io.BytesIO(clip()), "clip.wav")}
    answer = client.post("/api/voices", data=form, content_type="multipart/form-data")
    assert answer.status_code == 403 and answer.get_json()["field"] == "X-CSRF-Token"


def test_a_clip_voice_does_not_mix_into_a_blend(client, workers):
    assert upload(client, clip()).status_code == 201
    blend = {"mix": [{"voice": "my voice", "weight": 1}, {"voice": 42, "weight": 1}]}
    job = client.post("/api/jobs", json={"text": TEXT, "voice": blend})
    assert job.status_code == 400 and job.get_json()["field"] == "voice"
    assert "reference clip" in job.get_json()["error"]
    stored = client.post("/api/voices", json={"name": "blend", "mix": blend["mix"]})
    assert stored.status_code == 400 and stored.get_json()["field"] == "mix"


@pytest.mark.database  # the kind is asked of the database (Voice.kind in SQL)
def test_a_clip_voice_is_found_by_its_kind(client, workers):
    upload(client, clip())
    client.post("/api/voices", json={"name": "seeded", "seed": 42})
    kinds = {
        kind: [v["name"] for v in client.get(f"/api/voices?kind={kind}").get_json()["voices"]]
        for kind in ("clip", "seed")
    }
    assert kinds == {"clip": ["my voice"], "seed": ["seeded"]}


def test_a_clip_voice_is_exported_and_imported_with_its_sample_and_words(client, workers):
    made = upload(client, clip()).get_json()
    exported = client.get("/api/voices/export").get_json()
    (entry,) = exported
    assert entry["kind"] == "clip" and not {"seed", "spk_emb", "mix"} & set(entry)
    client.delete(f"/api/voices/{made['id']}")
    assert client.post("/api/voices/import", json=exported).get_json() == {"added": ["my voice"], "skipped": []}
    (imported,) = client.get("/api/voices").get_json()["voices"]
    assert (imported["kind"], imported["spk_smp"], imported["txt_smp"]) == ("clip", made["spk_smp"], TRANSCRIPT)


def test_a_clip_voice_is_previewed_and_spoken_by_name_on_the_openai_endpoint_as_on_the_job_api(client, workers):
    voice = upload(client, clip()).get_json()
    preview = client.post(f"/api/voices/{voice['id']}/preview").get_json()
    assert wait_for(client, preview["id"], {"done"})["voice"]["catalog_id"] == voice["id"]
    # Its audio seed, read back from its job, makes the OpenAI endpoint's audio comparable with a job's.
    with client.post("/v1/audio/speech", json={"input": TEXT, "voice": "my voice", "response_format": "wav"}) as answer:
        assert answer.status_code == 200
        spoken_there = decode(answer.data)[0]
    job = wait_for(client, answer.headers["X-Job-Id"], {"done"})
    assert job["voice"]["catalog_id"] == voice["id"]
    # It streams: its chunks join to the unstreamed audio up to 16-bit rounding at their seams.
    np.testing.assert_allclose(spoken(client, "my voice", seed=job["result"]["seed"]), spoken_there, atol=1e-4)


def test_an_imported_clip_voice_is_its_sample_and_words_alone_and_mixes_into_no_imported_blend(client, workers):
    made = upload(client, clip()).get_json()
    entry = {"name": "copy", "spk_smp": made["spk_smp"], "txt_smp": TRANSCRIPT}
    for beside in ("seed", "spk_emb"):
        refused = client.post("/api/voices/import", json=[{**entry, beside: None}])
        assert refused.status_code == 400 and refused.get_json()["field"] == beside, refused.get_json()
    without_words = client.post("/api/voices/import", json=[{"name": "copy", "spk_smp": made["spk_smp"]}])
    assert without_words.status_code == 400 and without_words.get_json()["field"] == "body"
    blend = {"name": "blend", "mix": [{"voice": "my voice"}, {"voice": 42}]}
    refused = client.post("/api/voices/import", json=[blend])
    assert refused.status_code == 400 and refused.get_json()["field"] == "mix"
    assert "reference clip" in refused.get_json()["error"]
    assert [voice["name"] for voice in client.get("/api/voices").get_json()["voices"]] == ["my voice"]
