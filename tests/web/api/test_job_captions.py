"""A job's timeline and its captions (``GET /api/jobs/<id>/captions``), against real Redis and real CPU
workers (synthetic-tiny): each segment's times are where the audio has it, pauses counted."""

import io
import wave

import numpy as np
import pytest

from chattts_farm.settings import Settings
from tests.web.api.test_jobs import LONG_TEXT, wait_for
from tests.web.test_admission import capped_app
from worker.audio import SAMPLE_RATE

pytestmark = pytest.mark.database  # on SQLite and on PostgreSQL

PAUSE_S = Settings().segment_pause_s
# Three sentences each too long to share a segment (max_segment_chars: 120) with another.
SENTENCES = (
    "The first sentence of these captions is long enough to be a segment of its own here.",
    "The second one says that a --> b and <i>c</i> & d are text, not markup, in a caption.",
    "The third [uv_break] has a control tag that the caption leaves out of what it shows.",
)
CAPTIONS = [SENTENCES[0], SENTENCES[1], "The third has a control tag that the caption leaves out of what it shows."]


def cues(body: str) -> list[list[str]]:
    """The blocks of a caption file, each its lines: a blank line ends a block."""
    return [block.split("\n") for block in body.strip("\n").split("\n\n")]


def timestamp(seconds: float, mark: str) -> str:
    milliseconds = round(seconds * 1000)
    return f"00:00:{milliseconds // 1000:02d}{mark}{milliseconds % 1000:03d}"


def at(seconds: float, inward: int) -> int:
    """The sample at a time of the timeline, moved ``inward`` by its rounding to the millisecond at most."""
    return round(seconds * SAMPLE_RATE) + inward * SAMPLE_RATE // 2000


def assert_silences(samples: np.ndarray, timeline: list[dict], silences_s: list[float]) -> None:
    """The audio is silent for the given seconds before each segment and after the last (to the timeline's
    millisecond), where the timeline says, and the first and last samples of each segment are not."""
    total_s = len(samples) / SAMPLE_RATE
    edges = [0.0, *(time for entry in timeline for time in (entry["start_s"], entry["end_s"])), total_s]
    for quiet_from, quiet_to, silence_s in zip(edges[::2], edges[1::2], silences_s, strict=True):
        assert quiet_to - quiet_from == pytest.approx(silence_s, abs=0.0011)
        assert not samples[at(quiet_from, +1) : max(0, at(quiet_to, -1))].any()
    for entry in timeline:
        start, end = max(0, at(entry["start_s"], -1)), at(entry["end_s"], +1)
        assert samples[start : start + SAMPLE_RATE // 100].any() and samples[end - 2 * SAMPLE_RATE // 1000 : end].any()


def assert_silent_between_segments(samples: np.ndarray, timeline: list[dict]) -> None:
    """Each pause of the timeline is silence in the audio, with none before the first segment or after the last."""
    assert_silences(samples, timeline, [0.0, *[PAUSE_S] * (len(timeline) - 1), 0.0])


def pcm(wav_bytes: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(wav_bytes)) as audio:
        return np.frombuffer(audio.readframes(audio.getnframes()), dtype="<i2")


def test_a_done_job_has_each_segment_in_its_timeline_where_its_audio_has_it(client, workers):
    job_id = client.post("/api/jobs", json={"text": " ".join(SENTENCES), "seed": 3}).get_json()["id"]
    result = wait_for(client, job_id, {"done"})["result"]
    timeline = result["timeline"]
    assert [entry["text"] for entry in timeline] == CAPTIONS
    assert [entry["index"] for entry in timeline] == [0, 1, 2] and result["segments"] == 3
    assert timeline[0]["start_s"] == 0.0 and timeline[-1]["end_s"] == result["duration_s"]
    samples = pcm(client.get(result["audio_url"]).data)
    assert len(samples) / SAMPLE_RATE == pytest.approx(result["duration_s"], abs=0.0006)
    assert_silent_between_segments(samples, timeline)


def test_captions_are_one_cue_per_segment_in_webvtt_or_subrip_with_the_text_escaped(client, workers):
    job_id = client.post("/api/jobs", json={"text": " ".join(SENTENCES)}).get_json()["id"]
    timeline = wait_for(client, job_id, {"done"})["result"]["timeline"]

    vtt = client.get(f"/api/jobs/{job_id}/captions")
    assert vtt.status_code == 200 and vtt.headers["Content-Type"] == "text/vtt; charset=utf-8"
    header, *vtt_cues = cues(vtt.text)
    assert header == ["WEBVTT"]
    assert vtt_cues == [
        [str(entry["index"] + 1), f"{timestamp(entry['start_s'], '.')} --> {timestamp(entry['end_s'], '.')}", text]
        for entry, text in zip(
            timeline,
            [
                CAPTIONS[0],
                "The second one says that a --&gt; b and &lt;i&gt;c&lt;/i&gt; &amp; d are text, not markup,"
                " in a caption.",
                CAPTIONS[2],
            ],
            strict=True,
        )
    ]
    assert client.get(f"/api/jobs/{job_id}/captions?format=vtt").text == vtt.text

    srt = client.get(f"/api/jobs/{job_id}/captions?format=srt")
    assert srt.status_code == 200 and srt.headers["Content-Type"] == "application/x-subrip; charset=utf-8"
    assert cues(srt.text) == [
        [str(entry["index"] + 1), f"{timestamp(entry['start_s'], ',')} --> {timestamp(entry['end_s'], ',')}", text]
        for entry, text in zip(
            timeline,
            [
                CAPTIONS[0],
                "The second one says that a -- > b and <i>c</i> & d are text, not markup, in a caption.",
                CAPTIONS[2],
            ],
            strict=True,
        )
    ]


def test_a_streamed_job_has_the_timeline_of_the_audio_it_streamed(client, workers):
    job_id = client.post("/api/jobs", json={"text": " ".join(SENTENCES), "stream": True}).get_json()["id"]
    streamed = client.get(f"/api/jobs/{job_id}/stream?format=pcm")
    assert streamed.status_code == 200
    samples = np.frombuffer(streamed.data, dtype="<i2")
    result = wait_for(client, job_id, {"done"})["result"]
    assert [entry["text"] for entry in result["timeline"]] == CAPTIONS
    assert len(samples) / SAMPLE_RATE == pytest.approx(result["timeline"][-1]["end_s"], abs=0.0006)
    assert_silent_between_segments(samples, result["timeline"])
    assert client.get(f"/api/jobs/{job_id}/captions?format=srt").text.count(" --> ") == 3


def test_captions_are_refused_for_an_unknown_format_a_job_not_done_and_an_unknown_job(
    tiny_settings, tmp_path, idle_redis_url
):
    # A Redis no worker reads: the job stays queued for as long as the test looks (through real workers
    # a short job could be done before the second look).
    client = capped_app(tiny_settings, tmp_path, idle_redis_url).test_client()
    job_id = client.post("/api/jobs", json={"text": LONG_TEXT}).get_json()["id"]
    unknown = client.get(f"/api/jobs/{job_id}/captions?format=ass")
    assert unknown.status_code == 400 and unknown.get_json()["field"] == "format"
    early = client.get(f"/api/jobs/{job_id}/captions")
    assert early.status_code == 409 and "not done" in early.get_json()["error"]
    client.delete(f"/api/jobs/{job_id}")
    cancelled = client.get(f"/api/jobs/{job_id}/captions")
    assert cancelled.status_code == 409 and "cancelled" in cancelled.get_json()["error"]
    assert client.get("/api/jobs/no-such-job/captions").status_code == 404
