"""A result crosses from the engine process to the Celery side as a plain message and is the same there."""

import dataclasses
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from worker.audio import SAMPLE_RATE, decode
from worker.channel import Channel
from worker.results import SynthesisResult, timeline


def a_result() -> SynthesisResult:
    tone = np.sin(np.linspace(0, 440 * 2 * np.pi, SAMPLE_RATE)).astype(np.float32) * 0.5
    return SynthesisResult(
        request_id="job-1",
        pieces=[tone, tone[: SAMPLE_RATE // 2]],
        silences=[0, SAMPLE_RATE // 4, 0],
        format="wav",
        mime_type="audio/wav",
        sample_rate=SAMPLE_RATE,
        duration_s=1.75,
        tokens=40,
        segments=2,
        seed=7,
        voice_embedding="an embedding",
        batch_size=3,
        timings={"text_s": 0.01, "generate_s": 0.5, "decode_s": 0.1},
        quality={"ok": True, "flags": [], "retried_segments": 0, "segments": [{"ok": True}, {"ok": True}]},
        model={"kind": "synthetic", "device": "cpu"},
        memory={},
        timeline=timeline([tone.size, SAMPLE_RATE // 2], [0, SAMPLE_RATE // 4, 0], SAMPLE_RATE, ["One.", "Two."]),
    )


def over_the_channel(sent: SynthesisResult) -> SynthesisResult:
    """The result as the Celery side rebuilds it from the engine process's message."""
    ours, theirs_socket = Channel.pair()
    theirs = Channel.from_fd(theirs_socket.detach())
    try:
        ours.send("finished", result=sent.as_message())
        return SynthesisResult.from_message(theirs.receive()["result"])
    finally:
        ours.close()
        theirs.close()


def test_a_result_sent_as_a_message_is_rebuilt_with_the_same_samples_and_summary():
    sent = a_result()
    rebuilt = over_the_channel(sent)
    assert rebuilt.summary() == sent.summary()
    assert np.array_equal(rebuilt.samples, sent.samples)


def test_a_streamed_result_crosses_without_audio_and_takes_what_was_streamed_as_its_own():
    plain = a_result()
    rebuilt = over_the_channel(dataclasses.replace(plain, pieces=None))  # its audio went out as it was drawn
    assert rebuilt.pieces is None and rebuilt.summary() == plain.summary()
    # The chunks as they came: the first segment, the pause, the second, in pieces of any size.
    whole = plain.samples
    chunks = np.split(whole, [1_000, SAMPLE_RATE, SAMPLE_RATE + SAMPLE_RATE // 4, 40_000])
    streamed = rebuilt.with_streamed_audio(chunks)
    assert np.array_equal(streamed.samples, whole)
    assert streamed.audio == plain.audio and streamed.summary()["timeline"] == plain.timeline
    assert rebuilt.with_streamed_audio([]).samples.size == 0


def test_the_samples_are_the_pieces_with_a_pause_between_and_the_audio_is_them_encoded():
    result = a_result()
    assert result.samples.size == SAMPLE_RATE + SAMPLE_RATE // 4 + SAMPLE_RATE // 2
    assert not result.samples[SAMPLE_RATE : SAMPLE_RATE + SAMPLE_RATE // 4].any()
    decoded, rate = decode(result.audio)
    assert rate == SAMPLE_RATE and np.allclose(decoded, result.samples, atol=1 / 16_000)
    assert "encode_s" in result.summary()["timings"]


def test_the_timeline_places_each_segment_where_the_joined_samples_have_it_pauses_counted():
    result = a_result()
    assert result.timeline == [
        {"index": 0, "text": "One.", "start_s": 0.0, "end_s": 1.0},
        {"index": 1, "text": "Two.", "start_s": 1.25, "end_s": 1.75},
    ]
    first, second = result.timeline
    assert np.array_equal(result.samples[:SAMPLE_RATE], result.pieces[0])
    assert not result.samples[round(first["end_s"] * SAMPLE_RATE) : round(second["start_s"] * SAMPLE_RATE)].any()
    assert np.array_equal(result.samples[round(second["start_s"] * SAMPLE_RATE) :], result.pieces[1])
    assert second["end_s"] == result.samples.size / SAMPLE_RATE


def test_silence_before_the_first_segment_and_after_the_last_is_in_the_samples_and_the_timeline():
    tone = a_result().pieces[0]
    silences = [SAMPLE_RATE // 2, 3 * SAMPLE_RATE, SAMPLE_RATE]
    result = dataclasses.replace(
        a_result(),
        pieces=[tone, tone],
        silences=silences,
        timeline=timeline([tone.size, tone.size], silences, SAMPLE_RATE, ["One.", "Two."]),
    )
    assert [(entry["start_s"], entry["end_s"]) for entry in result.timeline] == [(0.5, 1.5), (4.5, 5.5)]
    assert result.samples.size == 6.5 * SAMPLE_RATE
    assert not result.samples[: SAMPLE_RATE // 2].any() and not result.samples[-SAMPLE_RATE:].any()
    assert not result.samples[round(1.5 * SAMPLE_RATE) : round(4.5 * SAMPLE_RATE)].any()
    assert np.array_equal(result.samples[round(4.5 * SAMPLE_RATE) : round(5.5 * SAMPLE_RATE)], tone)


def test_a_costly_format_is_encoded_by_a_process_of_the_pool_and_the_audio_is_the_same():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        for audio_format in ("flac", "mp3"):
            result = dataclasses.replace(a_result(), format=audio_format)
            pooled = result.encoded_by(pool)
            assert pooled == dataclasses.replace(a_result(), format=audio_format).audio
            assert result.timings["encode_s"] > 0


def test_wav_is_encoded_in_the_callers_thread_not_sent_to_the_pool():
    class NoPool:
        def submit(self, *_):
            raise AssertionError("wav went to the pool")

    assert decode(a_result().encoded_by(NoPool()))[1] == SAMPLE_RATE
