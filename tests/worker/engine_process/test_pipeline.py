"""The synthesis core on synthetic-tiny weights: batching, voices, long text, formats, bad input."""

import copy
import dataclasses
import gc
import sys

import numpy as np
import pytest

from chattts_farm.contract import FORMATS, JobCancelled, SynthesisRequest
from chattts_farm.speech_length import TOKENS_PER_SECOND, expected_tokens
from worker.audio import SAMPLE_RATE, decode
from worker.engine_process.pipeline import Synthesizer
from worker.engine_process.voices import embedding_for_seed
from worker.interpreter import SWITCH_INTERVAL_S


def samples_of(result):
    samples, rate = decode(result.audio)
    assert rate == SAMPLE_RATE
    return samples


def only(outcomes):
    assert len(outcomes) == 1
    assert not isinstance(outcomes[0], Exception), outcomes[0]
    return outcomes[0]


def test_the_model_reports_what_it_is(synthesizer):
    assert synthesizer.model.info.as_dict() == {
        "kind": "synthetic",
        "scale": "tiny",
        "source": "synthetic-tiny",
        "device": "cpu",
        "dtype": "fp32",
    }


def test_what_loading_left_is_out_of_the_garbage_collectors_passes(synthesizer):
    assert all(o is not synthesizer.model for o in gc.get_objects())


def test_a_result_carries_audio_and_its_description(synthesizer, make_request):
    result = only(synthesizer.synthesize([make_request(seed=3)]))
    assert result.format == "wav" and result.mime_type == "audio/wav" and result.sample_rate == SAMPLE_RATE
    assert result.duration_s == pytest.approx(len(samples_of(result)) / SAMPLE_RATE, abs=1e-3)
    assert result.segments == 1 and result.seed == 3 and result.batch_size == 1
    assert result.tokens == result.quality["segments"][0]["tokens"] > 0
    assert set(result.timings) == {"text_s", "generate_s", "decode_s", "encode_s"}
    assert result.quality["ok"] and result.model["kind"] == "synthetic"


def test_the_synthetic_length_rule_ends_a_segment_after_tokens_proportional_to_its_text(synthesizer, make_request):
    short = only(synthesizer.synthesize([make_request("Hi there.")]))
    longer = only(synthesizer.synthesize([make_request("Hi there, how are you doing on this fine morning?")]))
    for result, text in ((short, "Hi there."), (longer, "Hi there, how are you doing on this fine morning?")):
        assert result.tokens == expected_tokens(text, 5)
        assert result.quality["segments"][0]["ended_by"] == "length_rule"
    assert longer.duration_s > 2 * short.duration_s


def test_a_seed_is_one_voice_every_time(synthesizer):
    speaker = synthesizer.model.chat.speaker
    assert embedding_for_seed(speaker, 42) == embedding_for_seed(speaker, 42)
    assert embedding_for_seed(speaker, 42) != embedding_for_seed(speaker, 43)


def test_a_models_speaker_statistics_are_read_once_not_at_every_request(synthesizer):
    """On a GPU each read of the statistics waits for the work queued there: they are read once a model."""
    model_speaker = synthesizer.model.chat.speaker
    speaker = copy.copy(model_speaker)  # another model's speaker, to this module
    first = embedding_for_seed(speaker, 42)
    assert first == embedding_for_seed(model_speaker, 42)
    speaker.std = speaker.std * 2  # changed where they live: not read again
    assert embedding_for_seed(speaker, 42) == first
    doubled = copy.copy(speaker)  # a speaker of its own reads its own
    assert embedding_for_seed(doubled, 42) != first


def test_same_voice_and_audio_seed_give_the_same_audio_different_voices_differ(synthesizer, make_request):
    first = only(synthesizer.synthesize([make_request(voice=42, seed=7)]))
    again = only(synthesizer.synthesize([make_request(voice=42, seed=7)]))
    other_voice = only(synthesizer.synthesize([make_request(voice=43, seed=7)]))
    assert first.audio == again.audio
    assert first.voice_embedding == again.voice_embedding != other_voice.voice_embedding
    assert not np.allclose(samples_of(first), samples_of(other_voice), atol=1e-3)


def test_an_embedding_string_is_the_same_voice_as_its_seed(synthesizer, make_request):
    by_seed = only(synthesizer.synthesize([make_request(voice=42, seed=7)]))
    by_embedding = only(synthesizer.synthesize([make_request(voice=by_seed.voice_embedding, seed=7)]))
    assert by_seed.audio == by_embedding.audio


def test_without_an_audio_seed_one_is_drawn_and_reported_so_the_audio_can_be_reproduced(synthesizer, make_request):
    drawn = only(synthesizer.synthesize([make_request(voice=5)]))
    replayed = only(synthesizer.synthesize([make_request(voice=5, seed=drawn.seed)]))
    assert drawn.audio == replayed.audio


def test_each_request_of_a_mixed_batch_sounds_as_it_does_alone_with_its_audio_seed(synthesizer, make_request):
    requests = [
        make_request("Hello world.", voice=1, top_k=1, speed=5, seed=11),
        make_request("A longer sentence, spoken by another voice entirely.", voice=2, top_k=1, speed=3, seed=12),
        make_request("你好，世界。", voice=3, top_k=1, temperature=0.7, top_p=0.5, seed=13),
        make_request("Short.", voice=4, top_k=1, speed=8, repetition_penalty=1.2, seed=14),
    ]
    together = synthesizer.synthesize(requests)
    assert all(result.batch_size == 4 for result in together)
    for request, mixed in zip(requests, together, strict=True):
        alone = only(synthesizer.synthesize([request]))
        assert mixed.tokens == alone.tokens
        np.testing.assert_allclose(samples_of(mixed), samples_of(alone), atol=2e-3)


def running_counts(synthesizer, monkeypatch):
    """The number of segments each of the engine's decode steps ran, as the engine goes."""
    counts = []
    real_decode_step = synthesizer.engine._decode_step

    def counted():
        counts.append(synthesizer.engine.running)
        real_decode_step()

    monkeypatch.setattr(synthesizer.engine, "_decode_step", counted)
    return counts


def test_the_requests_of_one_call_run_together_in_the_engine(tiny_settings, synthesizer, make_request, monkeypatch):
    core = Synthesizer(synthesizer.model, tiny_settings)
    counts = running_counts(core, monkeypatch)
    core.synthesize([make_request(voice=v, temperature=0.1 * v, top_k=v) for v in range(1, 6)])
    assert counts[0] == 5


def test_more_segments_than_slots_wait_for_a_free_slot_and_all_complete(
    tiny_settings, synthesizer, make_request, monkeypatch
):
    small = Synthesizer(synthesizer.model, dataclasses.replace(tiny_settings, slots=2))
    counts = running_counts(small, monkeypatch)
    outcomes = small.synthesize([make_request(voice=v) for v in range(5)])
    assert max(counts) == 2 and all(not isinstance(o, Exception) for o in outcomes)


def test_a_request_added_while_others_run_joins_them_at_the_next_step(tiny_settings, synthesizer, make_request):
    core = Synthesizer(synthesizer.model, tiny_settings)
    first = core.add([make_request("The first request, running for a while. " * 4, seed=1)])[0]
    core.step()
    late = core.add([make_request("A late one.", seed=2)])[0]
    core.step()
    assert core.engine.running == len(first.segments) + len(late.segments)
    outcomes = {}
    while core.in_flight:
        outcomes.update({entry.number: outcome for entry, outcome in core.step()})
    # It came out before the long one, and sounds as it does alone (up to float rounding).
    assert list(outcomes)[0] == late.number
    alone = only(core.synthesize([make_request("A late one.", seed=2)]))
    assert outcomes[late.number].tokens == alone.tokens
    np.testing.assert_allclose(samples_of(outcomes[late.number]), samples_of(alone), atol=2e-3)


def test_a_decoded_segment_lets_go_of_its_hidden_states_and_of_those_retired_with_it(synthesizer, make_request):
    # Segments retired in one step share one copy of their outputs: a segment that still pointed into it
    # once decoded would hold every segment's hidden states of that step until its own request ended.
    entry = synthesizer.add([make_request("One sentence to say. And a second one after it. " * 3, seed=4)])[0]
    while synthesizer.in_flight:
        synthesizer.step()
    assert len(entry.segments) > 1
    for segment in entry.segments:
        assert segment.output.hiddens.shape[0] == 0 and segment.output.hiddens.untyped_storage().nbytes() == 0


def test_long_text_becomes_one_complete_audio_without_a_cut_off(synthesizer, make_request):
    sentence = "The farm reads long documents aloud without cutting them off. "
    text = (sentence * 40)[:2000]
    result = only(synthesizer.synthesize([make_request(text)]))
    assert result.segments >= 15
    assert all(s["ended_by"] == "length_rule" for s in result.quality["segments"])
    speech_s = result.tokens / TOKENS_PER_SECOND
    assert speech_s > 60  # far past stock ChatTTS's ~30-44 s cut-off
    assert result.duration_s == pytest.approx(len(samples_of(result)) / SAMPLE_RATE, abs=1e-3)
    assert result.duration_s > speech_s


SSML_DOCUMENT = (
    '<speak><break time="400ms"/>First words.<break time="1234ms"/><prosody rate="x-slow">Slow words.</prosody>'
    '<s>Last words.</s><break time="2s"/></speak>'
)


def test_ssml_breaks_are_exact_silences_in_the_audio_where_its_timeline_says(synthesizer, make_request, tiny_settings):
    result = only(synthesizer.synthesize([make_request(SSML_DOCUMENT, seed=3)]))
    assert [entry["text"] for entry in result.timeline] == ["First words.", "Slow words.", "Last words."]
    # <s> is a boundary with the usual pause; each break is its own length, before, between and after.
    silences = [round(seconds * SAMPLE_RATE) for seconds in (0.4, 1.234, tiny_settings.segment_pause_s, 2.0)]
    pieces = result.pieces
    assert all(np.abs(piece).max() > 0.01 for piece in pieces)
    laid_out = [np.zeros(silences[0])]
    for piece, silence_after in zip(pieces, silences[1:], strict=True):
        laid_out += [piece, np.zeros(silence_after)]
    assert np.array_equal(result.samples, np.concatenate(laid_out))
    for index, entry in enumerate(result.timeline):
        start = sum(silences[: index + 1]) + sum(piece.size for piece in pieces[:index])
        assert entry["start_s"] == pytest.approx(start / SAMPLE_RATE, abs=0.0005)
        assert entry["end_s"] == pytest.approx((start + pieces[index].size) / SAMPLE_RATE, abs=0.0005)
    length = sum(silences) + sum(piece.size for piece in pieces)
    assert len(samples_of(result)) == length and result.duration_s == pytest.approx(length / SAMPLE_RATE, abs=0.0005)


def test_a_prosody_rate_sets_the_speed_its_segment_is_spoken_at(synthesizer, make_request):
    result = only(synthesizer.synthesize([make_request(SSML_DOCUMENT, seed=3, speed=6)]))
    first, slow, last = (segment["tokens"] for segment in result.quality["segments"])
    assert slow == expected_tokens("Slow words.", 1) > expected_tokens("Slow words.", 6)
    assert (first, last) == (expected_tokens("First words.", 6), expected_tokens("Last words.", 6))


@pytest.mark.parametrize("audio_format", FORMATS)
def test_every_format_round_trips(synthesizer, make_request, audio_format):
    result = only(synthesizer.synthesize([make_request(format=audio_format, seed=1)]))
    samples = samples_of(result)
    assert abs(len(samples) / SAMPLE_RATE - result.duration_s) < 0.05
    assert np.abs(samples).max() > 0.01


def test_bad_requests_fail_alone_and_name_their_field(synthesizer, make_request, tiny_settings):
    wrong_width_voice = "蘁淰敕欀" * 8
    too_long = dataclasses.replace(make_request(), text="word " * (tiny_settings.max_text_chars // 5 + 1))
    requests = [
        make_request("Fine."),
        SynthesisRequest("12345 !!! ..."),  # unvalidated: the core refuses it on its own
        SynthesisRequest("Odd.", voice=wrong_width_voice),
        too_long,
        make_request("Still fine."),
    ]
    outcomes = synthesizer.synthesize(requests)
    assert not isinstance(outcomes[0], Exception) and not isinstance(outcomes[4], Exception)
    assert [o.field for o in outcomes[1:4]] == ["text", "voice", "text"]
    assert "nothing speakable" in str(outcomes[1]) and "maximum" in str(outcomes[3])


def test_the_quality_gate_retries_a_flagged_segment_once_with_another_seed(tiny_settings, synthesizer, make_request):
    capped = Synthesizer(synthesizer.model, dataclasses.replace(tiny_settings, max_new_tokens=16))
    result = only(capped.synthesize([make_request("This sentence needs far more than sixteen tokens.", seed=4)]))
    segment = result.quality["segments"][0]
    assert segment["ended_by"] == "token_limit" and segment["retried"]
    assert not result.quality["ok"] and "token_limit" in result.quality["flags"]
    assert result.quality["retried_segments"] == 1


class Hearing:
    """A recogniser that hears what it is told to, in turn, and counts what it was asked."""

    name = "scripted"

    def __init__(self, *heard):
        self.heard = list(heard)
        self.asked = 0

    def hears(self, text):
        return True

    def transcribe_batch(self, clips, sample_rate, expected_texts):
        self.asked += len(clips)
        return [self.heard.pop(0) if self.heard else "" for _ in clips]


@pytest.fixture
def listening(tiny_settings, synthesizer):
    """A synthesizer on the same model with the offline ASR backend on and two retries."""
    return Synthesizer(synthesizer.model, dataclasses.replace(tiny_settings, asr="offline", quality_retries=2))


def test_on_synthetic_weights_auto_hears_nothing(synthesizer, make_request):
    assert synthesizer.settings.asr == "auto" and synthesizer.listener is None
    result = only(synthesizer.synthesize([make_request(seed=3)]))
    assert result.quality["segments"][0]["asr"] is None and result.quality["ok"]


def test_noise_heard_by_the_offline_backend_is_generated_again_and_reported_a_mismatch(listening, make_request):
    result = only(listening.synthesize([make_request("One sentence here. And another one there.", seed=5)]))
    assert "asr_mismatch" in result.quality["flags"] and result.quality["retried_segments"] == result.segments
    for segment in result.quality["segments"]:
        assert segment["asr"]["backend"] == "offline" and not segment["asr"]["passed"]
        assert segment["asr"]["error_rate"] > listening.settings.asr_max_error_rate
        assert segment["flags"] == ["asr_mismatch"] and segment["retried"]


def test_of_the_attempts_heard_wrong_the_one_heard_best_is_kept(synthesizer, listening, make_request):
    # "hello world this is the farm speaking": 4 words of 7 missed, then all of them, twice.
    listening.listener.backend = hearing = Hearing("Hello, world. This", "", "")
    kept = only(listening.synthesize([make_request(seed=6)]))
    assert hearing.asked == 3  # the first attempt and two retries
    assert (listening.gates.asr_checks, listening.gates.asr_mismatches, listening.gates.regenerated) == (3, 3, 2)
    segment = kept.quality["segments"][0]
    assert segment["asr"] == {
        "backend": "scripted",
        "said": "Hello world. This is the farm speaking.",
        "heard": "Hello, world. This",
        "error_rate": 0.5714,
        "passed": False,
    }
    assert segment["retried"] and kept.quality["flags"] == ["asr_mismatch"]
    # The first attempt's audio: what the same seed makes with nothing listening.
    assert kept.audio == only(synthesizer.synthesize([make_request(seed=6)])).audio


def test_a_segment_heard_right_on_a_retry_is_kept(listening, make_request):
    listening.listener.backend = hearing = Hearing("", "hello world this is the farm speaking")
    result = only(listening.synthesize([make_request(seed=7)]))
    assert hearing.asked == 2 and result.quality["ok"] and result.quality["retried_segments"] == 1
    assert (listening.gates.asr_checks, listening.gates.asr_mismatches, listening.gates.regenerated) == (2, 1, 1)
    assert result.quality["segments"][0]["asr"]["passed"] and result.quality["segments"][0]["asr"]["error_rate"] == 0


def test_a_streamed_segment_is_heard_and_reported_never_generated_again(listening, make_request):
    listening.listener.backend = hearing = Hearing()
    chunks = []
    result = only(
        listening.synthesize([make_request(seed=8)], on_audio=[lambda segment, samples: chunks.append(samples)])
    )
    assert chunks and hearing.asked == 1
    assert result.quality["flags"] == ["asr_mismatch"] and result.quality["retried_segments"] == 0


def test_progress_is_reported_and_ends_at_one(synthesizer, make_request):
    reports = []
    synthesizer.synthesize(
        [make_request("Progress please. " * 30)],
        on_progress=lambda index, fraction, done, total: reports.append((index, fraction, done, total)),
    )
    assert reports[-1][1] == 1.0 and reports[-1][2] == reports[-1][3]
    fractions = [fraction for _, fraction, _, _ in reports]
    assert fractions == sorted(fractions)


def test_a_call_of_more_requests_than_a_pass_adds_them_a_pass_at_a_time_and_answers_each_in_order(
    tiny_settings, synthesizer, make_request, monkeypatch
):
    core = Synthesizer(synthesizer.model, dataclasses.replace(tiny_settings, max_segments_per_pass=2))
    sizes = []
    add = core.add
    monkeypatch.setattr(core, "add", lambda requests, *rest: sizes.append(len(requests)) or add(requests, *rest))
    requests = [make_request(f"Request number {number}.", seed=number) for number in range(5)]
    # The last one is cancelled before its turn to be added: it is never prepared.
    outcomes = core.synthesize(requests, cancelled=lambda: {4})
    assert sizes == [2, 2]
    assert [outcome.request_id for outcome in outcomes[:4]] == [request.request_id for request in requests[:4]]
    assert isinstance(outcomes[4], JobCancelled)


@pytest.mark.parametrize("slots", [64, 2])
def test_a_cancelled_request_stops_and_its_batch_mates_finish(tiny_settings, synthesizer, make_request, slots):
    core = Synthesizer(synthesizer.model, dataclasses.replace(tiny_settings, slots=slots))
    requests = [make_request("Cancel me, I am long. " * 20), make_request("Keep me, I am long too. " * 20)]
    outcomes = core.synthesize(requests, cancelled=lambda: {0})
    assert isinstance(outcomes[0], JobCancelled)
    assert not isinstance(outcomes[1], Exception) and outcomes[1].segments > 2


def test_the_engine_sizes_its_cache_after_the_vocoders_graphs_took_their_memory(tiny_settings, monkeypatch):
    # On the GPU the cache takes a share of the memory left free; window graphs captured after it ran an
    # H200 out of memory at warm-up. The CPU captures nothing, so the order is what is checked here.
    from worker.engine_process import pipeline

    calls = []
    capture_windows, engine_capacity = pipeline.Vocoder.capture_windows, pipeline.engine_capacity

    def capture_and_note(vocoder, *arguments):
        calls.append("vocoder's windows")
        return capture_windows(vocoder, *arguments)

    def size_and_note(*arguments):
        calls.append("engine's cache")
        return engine_capacity(*arguments)

    monkeypatch.setattr(pipeline.Vocoder, "capture_windows", capture_and_note)
    monkeypatch.setattr(pipeline, "engine_capacity", size_and_note)
    Synthesizer.load(tiny_settings)
    assert calls == ["vocoder's windows", "engine's cache"]


def test_a_process_that_loads_a_synthesizer_hands_its_interpreter_between_threads_promptly(tiny_settings):
    # The engine process's channel threads and the ASR gate's listener run beside the synthesizer's steps.
    default = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        Synthesizer.load(tiny_settings)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    finally:
        sys.setswitchinterval(default)
