"""A request made ready for the engine: its segments, each with its text, voice and seed."""

import dataclasses

import pytest

from chattts_farm.contract import InvalidRequest, RefineText, SynthesisRequest
from worker.engine.segment import segment_seed
from worker.engine_process.prepare import Preparer


@pytest.fixture
def preparer(synthesizer, tiny_settings):
    return Preparer(synthesizer.model, dataclasses.replace(tiny_settings, max_segment_chars=40))


def test_long_text_becomes_ordered_segments_each_seeded_from_the_requests_seed(preparer, make_request):
    text = "The first sentence is here. The second one follows it. A third ends the text."
    entry = preparer.prepare(7, make_request(text, seed=1234, voice=3))
    assert len(entry.segments) >= 2 and entry.seed == 1234
    assert [segment.index for segment in entry.segments] == list(range(len(entry.segments)))
    assert [segment.seed for segment in entry.segments] == [segment_seed(1234, i) for i in range(len(entry.segments))]
    assert {segment.owner for segment in entry.segments} == {7}
    assert len({id(segment.speaker) for segment in entry.segments}) == 1  # one voice for all
    assert all(segment.expected_tokens > 0 for segment in entry.segments)


def test_a_request_without_a_seed_is_given_one_that_reproduces_it(preparer, make_request):
    drawn = preparer.prepare(0, make_request("Hello there."))
    again = preparer.prepare(1, make_request("Hello there.", seed=drawn.seed))
    assert [segment.seed for segment in again.segments] == [segment.seed for segment in drawn.segments]


@pytest.mark.parametrize(("text", "says"), [("12345 !!! ...", "nothing speakable"), ("word " * 2000, "the maximum is")])
def test_text_that_cannot_be_spoken_is_refused_naming_the_text(preparer, text, says):
    with pytest.raises(InvalidRequest, match=says) as refused:
        preparer.prepare(0, SynthesisRequest(text))
    assert refused.value.field == "text"


def test_refine_text_changes_only_the_requests_that_asked_for_it(preparer, make_request):
    plain = preparer.prepare(0, make_request("Keep me as I am."))
    refined = preparer.prepare(1, dataclasses.replace(make_request("Refine me."), refine_text=RefineText()))
    before = [segment.text for segment in plain.segments]
    preparer.refine([plain, refined])
    assert [segment.text for segment in plain.segments] == before
    assert all(segment.text for segment in refined.segments)


def test_an_ssml_documents_boundaries_breaks_and_rates_become_segments_silences_and_speeds(preparer, make_request):
    document = (
        '<speak><break time="300ms"/><p>First paragraph.</p><p>Second <break strength="none"/>paragraph.</p>'
        '<prosody rate="x-fast">Quick words.</prosody><break time="1.5s"/>Last words.<break time="2s"/></speak>'
    )
    entry = preparer.prepare(0, make_request(document, speed=4))
    assert [segment.caption for segment in entry.segments] == [
        "First paragraph.",
        "Second",
        "paragraph.",
        "Quick words.",
        "Last words.",
    ]
    assert [segment.speed for segment in entry.segments] == [4, 4, 4, 9, 4]
    assert all(f"[speed_{segment.speed}]" in segment.prompt for segment in entry.segments)
    pause = round(preparer.settings.segment_pause_s * 24_000)
    assert entry.silences == [300 * 24, pause, 0, pause, 1500 * 24, 2000 * 24]


def test_breaks_around_text_with_nothing_speakable_add_up_before_the_next_segment(preparer, make_request):
    entry = preparer.prepare(0, make_request('<speak>One.<break time="1s"/>12 34<break time="1s"/>Two.</speak>'))
    assert [segment.caption for segment in entry.segments] == ["One.", "Two."]
    assert entry.silences == [0, 2 * 24_000, 0]


def test_plain_text_has_the_usual_pause_between_segments_and_none_around_them(preparer, make_request):
    entry = preparer.prepare(0, make_request("The first sentence is here. The second one follows it."))
    pause = round(preparer.settings.segment_pause_s * 24_000)
    assert entry.silences == [0] + [pause] * (len(entry.segments) - 1) + [0]


def test_a_celery_callers_document_is_read_again_by_the_worker_trusting_no_one(preparer):
    with pytest.raises(InvalidRequest, match="holds <audio>") as refused:
        preparer.prepare(0, SynthesisRequest('<speak>Hi <audio src="x.wav"/></speak>'))
    assert refused.value.field == "text"
