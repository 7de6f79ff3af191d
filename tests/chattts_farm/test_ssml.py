"""The SSML subset: what a document is read into (speech and silences), and what is refused and why."""

import time

import pytest

from chattts_farm.contract import InvalidRequest, SynthesisRequest
from chattts_farm.speech_length import expected_seconds
from chattts_farm.ssml import (
    BREAK_STRENGTHS_MS,
    MAX_SILENCE_MS,
    Silence,
    Speech,
    SsmlRefused,
    is_document,
    read,
    script_of,
)


def test_a_text_is_ssml_when_it_begins_as_xml_does():
    assert is_document("<speak>Hi.</speak>") and is_document('  \n<speak version="1.1">Hi.</speak>')
    assert is_document('<?xml version="1.0"?><speak>Hi.</speak>') and is_document("<!-- a note --><speak/>")
    assert not is_document("Say <speak>Hi.</speak>") and not is_document("<3 you") and not is_document("<speaker>")


def test_plain_text_is_one_run_of_speech_at_the_requests_speed():
    assert script_of("Hello. <not> a tag") == (Speech("Hello. <not> a tag"),)


def test_paragraphs_and_sentences_are_runs_of_their_own_and_whitespace_is_one_space():
    assert read("<speak>Intro <p><s>One\n   two.</s><s>Three.</s></p> Outro</speak>") == (
        Speech("Intro"),
        Speech("One two."),
        Speech("Three."),
        Speech("Outro"),
    )


def test_a_break_is_silence_of_its_time_or_its_strength_and_breaks_in_a_row_add_up():
    assert read('<speak>A<break time="1.5s"/>B<break time="250ms"/><break strength="weak"/>C<break/></speak>') == (
        Speech("A"),
        Silence(1500),
        Speech("B"),
        Silence(250 + BREAK_STRENGTHS_MS["weak"]),
        Speech("C"),
        Silence(BREAK_STRENGTHS_MS["medium"]),
    )
    assert read('<speak>A<break strength="none"/>B<break time="2s" strength="x-weak"/></speak>') == (
        Speech("A"),
        Silence(0),
        Speech("B"),
        Silence(2000),
    )


def test_the_strengths_grow_from_none():
    assert list(BREAK_STRENGTHS_MS) == ["none", "x-weak", "weak", "medium", "strong", "x-strong"]
    assert sorted(BREAK_STRENGTHS_MS.values()) == list(BREAK_STRENGTHS_MS.values())


def test_a_prosody_rate_is_a_chattts_speed_for_the_text_inside_it_alone():
    assert read(
        '<speak>Normal <prosody rate="x-slow">very slow <prosody rate="200%">fast</prosody> slow again</prosody>'
        ' normal <prosody rate="medium">medium</prosody><prosody rate="50%">half</prosody></speak>'
    ) == (
        Speech("Normal"),
        Speech("very slow", 1),
        Speech("fast", 7),
        Speech("slow again", 1),
        Speech("normal"),
        Speech("medium", 5),
        Speech("half", 3),
    )


def test_a_sub_says_its_alias_and_a_say_as_spells_out_or_reads_a_number():
    assert read('<speak>The <sub alias="World Wide Web Consortium">W3C</sub> met.</speak>') == (
        Speech("The World Wide Web Consortium met."),
    )
    assert read(
        '<speak>Code <say-as interpret-as="characters">ab-12</say-as>, <say-as interpret-as="cardinal">'
        "-1,234</say-as> cats.</speak>"
    ) == (Speech("Code A B one two, minus one thousand, two hundred and thirty-four cats."),)


def test_chinese_text_says_numbers_in_chinese():
    assert read(
        '<speak>我有<say-as interpret-as="cardinal">1234</say-as>只猫，编号<say-as interpret-as="characters">'
        "42</say-as>。</speak>"
    ) == (Speech("我有一千二百三十四只猫，编号四 二。"),)


@pytest.mark.parametrize(
    ("document", "why"),
    [
        ("<speak>Hi <audio src='x.wav'/></speak>", "holds <audio>, which is not in the SSML the farm reads"),
        ("<speak><voice name='x'>Hi</voice></speak>", "holds <voice>"),
        ("<speak><emphasis>Hi</emphasis></speak>", "holds <emphasis>"),
        ("<speak><speak>Hi</speak></speak>", "one <speak> element around the whole text"),
        ("<speak>Hi <break>now</break></speak>", "words inside a <break>"),
        ("<speak><sub alias='x'>a <s>b</s></sub></speak>", "holds <s> inside <sub>"),
        ("<speak>Hi <break><s>b</s></break></speak>", "holds <s> inside a <break>"),
        ("<speak><sub>W3C</sub></speak>", 'without its alias="..."'),
        ("<speak><say-as interpret-as='date'>2024</say-as></speak>", "not one of characters, cardinal"),
        ("<speak><say-as interpret-as='cardinal'>1e9</say-as></speak>", "a cardinal is a whole number"),
        ("<speak><say-as interpret-as='cardinal'>" + "9" * 16 + "</say-as></speak>", "at most 15 digits"),
        ("<speak><break time='soon'/></speak>", "a time is milliseconds or seconds"),
        ("<speak><break strength='loud'/></speak>", "a strength is one of none, x-weak"),
        ("<speak><break time='10.5s'/></speak>", "one break is at most 10 s"),
        ("<speak><prosody rate='24%'>x</prosody></speak>", "from 25% to 400%"),
        ("<speak><prosody rate='+10%'>x</prosody></speak>", "a rate is one of x-slow, slow"),
        ("<speak><prosody volume='loud'>x</prosody></speak>", 'holds <prosody volume="...">'),
        ("<speak><p xml:lang='en'>x</p></speak>", "its attributes: none"),
        ("<speak>x<?php echo 1 ?></speak>", "processing instruction"),
        ("<speak>Hi &amp unterminated</speak>", "not well-formed SSML"),
        ("<speak>Hi", "not well-formed SSML: no element found at line 1"),
    ],
)
def test_what_is_outside_the_subset_is_refused_saying_what(document, why):
    with pytest.raises(SsmlRefused) as refused:
        read(document)
    assert why in str(refused.value)


def test_a_billion_laughs_stops_at_its_doctype_without_expanding_anything():
    entities = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    bomb = f'<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY l0 "lol">{entities}]><speak>&l9;</speak>'
    started = time.perf_counter()
    with pytest.raises(SsmlRefused, match="holds a DTD"):
        read(bomb)
    assert time.perf_counter() - started < 0.05


def test_xml_escapes_are_read_as_the_characters_they_stand_for():
    assert read("<speak>Fish &amp; chips &lt;3 &#x4F60;</speak>") == (Speech("Fish & chips <3 你"),)


def test_all_breaks_together_are_bounded_so_a_text_cannot_ask_for_hours_of_silence():
    most = MAX_SILENCE_MS // 10_000
    assert read("<speak>Wait." + '<break time="10s"/>' * most + "</speak>")[-1] == Silence(MAX_SILENCE_MS)
    with pytest.raises(SsmlRefused, match="add up to more than 60 s"):
        read("<speak>Wait." + '<break time="10s"/>' * most + '<break time="1ms"/></speak>')


def test_a_requests_expected_length_counts_each_run_at_its_speed_and_its_breaks():
    request = SynthesisRequest.from_arguments(
        {"text": '<speak>Hello <break time="1.5s"/><prosody rate="fast">world</prosody></speak>', "speed": 4},
        max_text_chars=1000,
    )
    assert request.expected_seconds == expected_seconds("Hello", 4) + 1.5 + expected_seconds("world", 7)


def test_a_request_reads_its_document_once_valid_and_keeps_it_as_written():
    document = '<speak>Hello <break time="1s"/><prosody rate="fast">world</prosody>.</speak>'
    request = SynthesisRequest.from_arguments({"text": document, "speed": 2}, max_text_chars=1000)
    assert request.text == document
    assert request.script == (Speech("Hello"), Silence(1000), Speech("world", 7), Speech("."))
    # What the worker is sent reads back as the same request, and the same script.
    again = SynthesisRequest.from_arguments(request.as_arguments(), max_text_chars=1000)
    assert again == request and again.script == request.script


def test_a_refused_document_is_an_invalid_text():
    with pytest.raises(InvalidRequest) as caught:
        SynthesisRequest.from_arguments({"text": "<speak><audio src='x'/>Hi</speak>"}, max_text_chars=1000)
    assert caught.value.field == "text" and "<audio>" in caught.value.message
