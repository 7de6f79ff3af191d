"""Streaming: a request's audio goes out in order while the engine draws it, and joined it is the audio
the request has unstreamed."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from chattts_farm.contract import CLIP_SAMPLE_RATE, SynthesisRequest
from worker.audio import SAMPLE_RATE
from worker.engine.blocks import blocks_for
from worker.engine.engine import SYNC_EVERY
from worker.engine.runner import ModelRunner
from worker.engine.segment import Segment
from worker.engine.sizing import max_prompt_tokens
from worker.engine_process.pipeline import Synthesizer
from worker.engine_process.streaming import FIRST_CHUNK_S, RequestStream
from worker.engine_process.voices import speaker_sample
from worker.vocoder.quality import SampleStats

LONG_TEXT = (
    "The farm streams its audio while it speaks. Every segment starts as soon as the engine has it. "
    "A later segment waits for the ones before it, then follows a short pause. "
    "Joined, the chunks are the audio the job has when it is not streamed."
)


@pytest.fixture
def core(tiny_settings, synthesizer):
    return Synthesizer(synthesizer.model, tiny_settings)


@pytest.fixture(params=["measured", "receptive field"])
def any_context_core(request, tiny_settings, synthesizer):
    """A synthesizer whose streamed chunks take the context measured at load, or the whole receptive field."""
    frames = 0 if request.param == "measured" else synthesizer.vocoder.context_frames
    return Synthesizer(synthesizer.model, dataclasses.replace(tiny_settings, stream_context_frames=frames))


def run(core, requests, on_audio):
    """Drive the synthesizer as the batcher does; returns the outcomes by request id and, for each
    delivery, (request id, how many steps had run, samples)."""
    steps = 0
    outcomes = {}
    added = core.add(requests, on_audio)
    assert all(not isinstance(entry, Exception) for entry in added)
    while core.in_flight:
        for entry, outcome in core.step():
            outcomes[entry.request.request_id] = (outcome, steps)
        steps += 1
    return outcomes


def assert_describes_the_audio_that_went_out(result, joined):
    """A streamed result carries no audio (it went out as it was drawn), and describes what went out."""
    assert result.pieces is None
    assert result.duration_s == round(joined.size / result.sample_rate, 3)
    assert result.timeline[-1]["end_s"] <= result.duration_s


def test_joined_chunks_are_the_unstreamed_audio_and_the_result_describes_them(any_context_core, make_request):
    core = any_context_core
    request = SynthesisRequest(**{**make_request(LONG_TEXT, seed=7).__dict__, "request_id": "streamed"})
    chunks = []
    (streamed, _) = run(core, [request], [lambda segment, samples: chunks.append(samples)])["streamed"]
    assert streamed.segments > 1
    joined = np.concatenate(chunks)
    assert_describes_the_audio_that_went_out(streamed, joined)
    # What went out is the audio of the same request unstreamed, up to float rounding, and judged alike.
    plain = core.synthesize([make_request(LONG_TEXT, seed=7)])[0]
    assert joined.shape == plain.samples.shape
    assert np.abs(joined - plain.samples).max() < 1e-4
    assert streamed.timeline == plain.timeline
    assert [segment["flags"] for segment in streamed.quality["segments"]] == [
        segment["flags"] for segment in plain.quality["segments"]
    ]


def test_a_streamed_ssml_documents_chunks_hold_its_breaks_before_between_and_after_its_segments(core, make_request):
    document = '<speak><break time="300ms"/>Hello there.<break time="1s"/>Goodbye now.<break time="500ms"/></speak>'
    request = dataclasses.replace(make_request(document, seed=7), request_id="streamed")
    chunks = []
    (streamed, _) = run(core, [request], [lambda segment, samples: chunks.append((segment, samples))])["streamed"]
    joined = np.concatenate([samples for _, samples in chunks])
    assert_describes_the_audio_that_went_out(streamed, joined)
    assert chunks[0][0] == 0 and chunks[0][1].size == 0.3 * 24_000 and not chunks[0][1].any()
    assert chunks[-1][0] == 1 and chunks[-1][1].size == 0.5 * 24_000 and not chunks[-1][1].any()
    plain = core.synthesize([make_request(document, seed=7)])[0]
    assert joined.shape == plain.samples.shape and np.abs(joined - plain.samples).max() < 1e-4


def test_streams_whose_segments_are_preempted_mid_stream_still_send_the_unstreamed_audio(
    tiny_settings, synthesizer, make_request
):
    # A KV cache that holds one longest segment runs dry with three requests of three segments each in
    # a voice from a 23 s reference clip: its sample's codes make each prompt about 1,100 tokens, so two
    # segments fit side by side at admission and outgrow the cache as they draw (the cache's least, one
    # longest segment, now holds a 30 s clip's prompt: plain text alone no longer fills it); the newest
    # is preempted and starts over, after some of its audio has gone out.
    settings = dataclasses.replace(tiny_settings, max_new_tokens=300)
    pcm = (np.random.default_rng(5).standard_normal(23 * CLIP_SAMPLE_RATE) * 3000).astype("<i2").tobytes()
    clip = {"spk_smp": speaker_sample(synthesizer.model.chat, pcm), "txt_smp": "The words of a long clip."}
    longest = blocks_for(max_prompt_tokens(settings) + settings.max_new_tokens)
    per_block = ModelRunner.bytes_per_block(synthesizer.model, kv_bytes=4)
    small = Synthesizer(
        synthesizer.model, dataclasses.replace(settings, kv_cache_gib=(longest + 0.5) * per_block / 2**30)
    )
    assert small.engine.scheduler.pool.blocks == longest
    requests = [
        SynthesisRequest(
            **{**make_request(LONG_TEXT, voice=clip, seed=7 + row).__dict__, "request_id": f"streamed-{row}"}
        )
        for row in range(3)
    ]
    chunks = [[] for _ in requests]
    run(small, requests, [lambda segment, samples, row=row: chunks[row].append(samples) for row in range(3)])
    assert small.engine.preemptions > 0
    plain = Synthesizer(synthesizer.model, settings).synthesize(
        [make_request(LONG_TEXT, voice=clip, seed=7 + row) for row in range(3)]
    )
    for streamed, unstreamed in zip(chunks, plain, strict=True):
        joined = np.concatenate(streamed)
        assert joined.shape == unstreamed.samples.shape
        assert np.abs(joined - unstreamed.samples).max() < 1e-4


def test_the_first_chunk_is_small_and_goes_out_long_before_the_request_ends(core, make_request):
    request = SynthesisRequest(**{**make_request(LONG_TEXT, seed=3).__dict__, "request_id": "streamed"})
    deliveries = []
    steps = {"now": 0}
    real_step = core.step

    def counted_step():
        steps["now"] += 1
        return real_step()

    core.step = counted_step
    (result, _) = run(core, [request], [lambda segment, samples: deliveries.append((steps["now"], samples.size))])[
        "streamed"
    ]
    first_at, first_size = deliveries[0]
    assert first_at < steps["now"] / 3
    assert first_size <= 0.5 * result.sample_rate
    assert max(size for _, size in deliveries) > first_size  # later chunks are larger


def test_a_streamed_and_a_plain_request_share_the_engine_and_each_gets_its_own_audio(core, make_request):
    streamed = SynthesisRequest(**{**make_request(LONG_TEXT, seed=1).__dict__, "request_id": "streamed"})
    plain = SynthesisRequest(**{**make_request("Only the result, please.", seed=2).__dict__, "request_id": "plain"})
    chunks = []
    outcomes = run(core, [streamed, plain], [lambda segment, samples: chunks.append(samples), None])
    joined = np.concatenate(chunks)
    assert_describes_the_audio_that_went_out(outcomes["streamed"][0], joined)
    streamed_alone = core.synthesize([make_request(LONG_TEXT, seed=1)])[0]
    assert joined.shape == streamed_alone.samples.shape
    assert np.abs(joined - streamed_alone.samples).max() < 1e-4
    alone = core.synthesize([make_request("Only the result, please.", seed=2)])[0]
    assert outcomes["plain"][0].samples.shape == alone.samples.shape
    assert np.abs(outcomes["plain"][0].samples - alone.samples).max() < 1e-4


def test_a_later_streams_first_segment_starts_before_the_later_segments_of_streams_that_came_first(
    tiny_settings, synthesizer, make_request
):
    # One slot: the engine admits one segment at a time, in the order their audio is wanted.
    core = Synthesizer(synthesizer.model, dataclasses.replace(tiny_settings, slots=1))
    first, later, plain = (
        SynthesisRequest(**{**make_request(LONG_TEXT, seed=seed).__dict__, "request_id": name})
        for seed, name in ((1, "first"), (2, "later"), (3, "plain"))
    )
    admitted = []
    schedule = core.engine.scheduler.schedule

    def noting_admissions(*arguments):
        scheduled = schedule(*arguments)
        admitted.extend((core.in_flight[s.owner].request.request_id, s.index) for s in scheduled.admitted)
        return scheduled

    core.engine.scheduler.schedule = noting_admissions
    core.add([first], [lambda segment, samples: None])
    core.add([later, plain], [lambda segment, samples: None, None])
    segments = len(core.in_flight[max(core.in_flight)].segments)
    while core.in_flight:
        core.step()
    assert segments > 1
    # The streams' first segments, then all of the plain request's (its audio is wanted whole, now),
    # then the streams' later ones.
    assert admitted[:2] == [("first", 0), ("later", 0)]
    assert admitted[2 : 2 + segments] == [("plain", index) for index in range(segments)]
    assert admitted[2 + segments : 4 + segments] == [("first", 1), ("later", 1)]


def segments_of(count):
    return [
        Segment(owner=0, index=i, text="x", request=None, speaker=None, seed=0, expected_tokens=1, max_tokens=1)
        for i in range(count)
    ]


class PieceOf:
    def __init__(self, segment, last):
        self.segment, self.last = segment, last


def test_a_later_segment_waits_for_the_ones_before_it_then_follows_the_silence_before_it():
    delivered = []
    segments = segments_of(3)
    stream = RequestStream(
        segments,
        deliver=lambda segment, samples: delivered.append((segment, samples)),
        silences=[0, 2, 5, 0],
        frames_per_second=50.0,
        context_frames=4,
    )
    audio = {name: np.full(3, value, dtype=np.float32) for value, name in enumerate("abcdef", start=1)}
    stream.take(PieceOf(segments[1], last=False), audio["c"])  # segment 1 is drawn first: held back
    stream.take(PieceOf(segments[2], last=True), audio["e"])
    assert delivered == []
    stream.take(PieceOf(segments[0], last=False), audio["a"])
    stream.take(PieceOf(segments[0], last=True), audio["b"])
    stream.take(PieceOf(segments[1], last=True), audio["d"])
    expected = [
        (0, audio["a"]),
        (0, audio["b"]),
        (1, np.zeros(2, dtype=np.float32)),
        (1, audio["c"]),
        (1, audio["d"]),
        (2, np.zeros(5, dtype=np.float32)),
        (2, audio["e"]),
    ]
    assert [segment for segment, _ in delivered] == [segment for segment, _ in expected]
    assert all(np.array_equal(got, want) for (_, got), (_, want) in zip(delivered, expected, strict=True))
    # Delivered, the pieces are the receiver's: the stream keeps what the quality gate reads of them.
    assert stream.samples(segments[1]) is None
    assert stream.sizes() == [6, 6, 3]
    assert stream.stats(segments[1]) == SampleStats.of(np.concatenate([audio["c"], audio["d"]]))


def test_a_stream_the_asr_gate_hears_keeps_each_segments_audio_whole():
    segments = segments_of(2)
    stream = RequestStream(
        segments,
        deliver=lambda segment, samples: None,
        silences=[0, 2, 0],
        frames_per_second=50.0,
        context_frames=4,
        keep_audio=True,
    )
    first, second = np.full(3, 0.5, dtype=np.float32), np.full(4, -0.25, dtype=np.float32)
    stream.take(PieceOf(segments[0], last=False), first)
    stream.take(PieceOf(segments[0], last=True), second)
    assert np.array_equal(stream.samples(segments[0]), np.concatenate([first, second]))


def test_silence_before_the_first_segment_goes_out_at_once_and_that_after_the_last_once_it_is_done():
    delivered = []
    segments = segments_of(2)
    stream = RequestStream(
        segments,
        deliver=lambda segment, samples: delivered.append((segment, samples.size, bool(samples.any()))),
        silences=[7, 0, 4],
        frames_per_second=50.0,
        context_frames=4,
    )
    assert delivered == [(0, 7, False)]
    stream.take(PieceOf(segments[0], last=True), np.ones(3, dtype=np.float32))
    stream.take(PieceOf(segments[1], last=True), np.ones(3, dtype=np.float32))
    assert delivered == [(0, 7, False), (0, 3, True), (1, 3, True), (1, 4, False)]


def test_a_later_segment_is_cut_once_it_plays_its_first_piece_keeping_every_stable_frame():
    first, later = segments_of(2)
    clock = {"now": 0.0}
    stream = RequestStream(
        [first, later],
        deliver=lambda *_: None,
        silences=[0, 0, 0],
        frames_per_second=40.0,
        context_frames=5,
        clock=lambda: clock["now"],
    )
    (piece,) = stream.cut(first, 40, zeros)
    stream.take(piece, np.ones(piece.keep_to * 600, dtype=np.float32))
    # While the first segment plays, the later one is not cut, however much of it is drawn.
    assert stream.cut(later, 200, zeros) == []
    stream.take(PieceOf(first, last=True), np.ones(6000, dtype=np.float32))
    clock["now"] = 10.0  # long since played: the later segment is wanted now
    (piece,) = stream.cut(later, 60, zeros)
    # From its row's start, so no context on its left; every frame but the newest 5, which may change.
    assert (piece.start, piece.keep_from, piece.keep_to) == (0, 0, 55)
    assert piece.hiddens.shape[0] == piece.keep_to + 5


def test_a_first_piece_ends_where_a_round_of_the_engine_leaves_it_stable_unless_that_is_too_short():
    segment = segments_of(1)[0]

    def first_cut(stream: RequestStream) -> int:
        for drawn in range(1, 400, SYNC_EVERY):  # the host learns of a prefill's token, then a round's
            if stream.cut(segment, drawn, zeros):
                return drawn

    # Full scale: 46.875 frames a second, 7 of context. 0.25 s (12 frames) would be cut with 25 drawn.
    full_scale = RequestStream(
        [segment], deliver=lambda *_: None, silences=[0, 0], frames_per_second=46.875, context_frames=7
    )
    assert (full_scale.first_chunk_frames, first_cut(full_scale)) == (10, 17)
    # With 5 frames of context at 40 a second, a round's worth would be 4 frames (0.1 s): too short.
    short = RequestStream([segment], deliver=lambda *_: None, silences=[0, 0], frames_per_second=40.0, context_frames=5)
    assert short.first_chunk_frames == math.ceil(FIRST_CHUNK_S * 40.0) == 10


def zeros(_, start: int, stop: int) -> torch.Tensor:
    return torch.zeros(stop - start, 1)


def stream_at_speed(speed: float, frames: int = 400) -> tuple[list[int], int]:
    """One segment of ``frames`` frames (40 a second, 5 of context) drawn ``speed`` times faster than it
    plays, a round of 8 frames at a time, each piece taken (its audio out) as it is cut, its last piece
    at the end: the frames each piece kept, and how often its audio ran out, played from its first."""
    clock, delivered = {"now": 0.0}, []
    segment = segments_of(1)[0]
    stream = RequestStream(
        [segment],
        deliver=lambda _, samples: delivered.append((clock["now"], samples.size / SAMPLE_RATE)),
        silences=[0, 0],
        frames_per_second=40.0,
        context_frames=5,
        clock=lambda: clock["now"],
    )
    kept = []
    for drawn in range(1, frames, SYNC_EVERY):
        for piece in stream.cut(segment, drawn, zeros):
            assert piece.keep_to <= drawn - 5  # the newest 5 frames may still change
            # Its context on either side, where the row has it.
            assert piece.start == max(0, piece.keep_from - 5)
            assert piece.hiddens.shape[0] == piece.keep_to + 5 - piece.start
            assert piece.keep_from == sum(kept)
            kept.append(piece.keep_to - piece.keep_from)
            stream.take(piece, np.ones(kept[-1] * SAMPLE_RATE // 40, dtype=np.float32))
        clock["now"] += SYNC_EVERY / 40.0 / speed
    kept.append(frames - sum(kept))
    stream.take(PieceOf(segment, last=True), np.ones(kept[-1] * SAMPLE_RATE // 40, dtype=np.float32))
    played_until, ran_out = delivered[0][0], 0
    for at, seconds in delivered:
        ran_out += at > played_until
        played_until = max(played_until, at) + seconds
    return kept, ran_out


def test_after_the_first_piece_a_stream_is_cut_as_its_lead_runs_low_the_faster_the_engine_the_fewer_pieces():
    pieces = {speed: stream_at_speed(speed) for speed in (1.5, 2.5, 6.0)}
    for kept, ran_out in pieces.values():
        assert kept[0] == 10  # 0.25 s first
        assert ran_out == 0
    # A 10-s segment: pieces of a size set by their place in the row (10, 20, 40, then 80 frames) took
    # 8 whatever the speed.
    assert [len(kept) for kept, _ in pieces.values()] == [11, 7, 5]
    # Each piece once the lead runs low takes every stable frame: at 6x, the later ones are several
    # seconds each.
    assert max(pieces[6.0][0]) >= 200


def test_a_stream_run_again_after_its_engine_died_cuts_nothing_that_went_out_and_what_follows_at_once():
    segment = segments_of(1)[0]
    clock = {"now": 0.0}
    sent = 2 * SAMPLE_RATE  # 2 s went out on the run that died: its receiver is waiting for the rest
    stream = RequestStream(
        [segment],
        deliver=lambda *_: None,
        silences=[0, 0],
        frames_per_second=40.0,
        context_frames=5,
        already_sent=sent,
        clock=lambda: clock["now"],
    )
    cut = []
    for drawn in range(1, 120, SYNC_EVERY):
        cut.extend((drawn, piece.keep_from, piece.keep_to) for piece in stream.cut(segment, drawn, zeros))
        clock["now"] += 0.01  # a fast engine: 8 frames (0.2 s) a round in 0.01 s
    # Nothing while every stable frame is within the 2 s (80 frames) that went out; then pieces go out
    # as soon as a first piece's worth (10 frames) more is stable, until the lead is back, the first from
    # the row's start to its newest stable frame.
    first_drawn, keep_from, keep_to = cut[0]
    assert first_drawn - 5 > 80 and keep_from == 0 and keep_to == first_drawn - 5
    assert cut[1][0] == first_drawn + 2 * SYNC_EVERY and cut[1][1:] == (keep_to, keep_to + 2 * SYNC_EVERY)
