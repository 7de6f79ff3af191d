"""The task contract: what a valid request is, and how a bad one is named."""

import pickle

import pytest

from worker.contract import DEFAULT_VOICE_SEED, InvalidRequest, SynthesisRequest, parse_voice

EMBEDDING = "蘁淰敕欀" * 8


def build(**arguments):
    return SynthesisRequest.from_arguments({"text": "Hello.", **arguments}, max_text_chars=100)


def test_defaults_follow_the_contract():
    request = build()
    assert (request.voice, request.format, request.speed) == (DEFAULT_VOICE_SEED, "wav", 5)
    assert (request.temperature, request.top_p, request.top_k) == (0.3, 0.7, 20)
    assert request.refine_text is None and request.seed is None


def test_a_voice_is_a_seed_or_an_embedding_string():
    assert parse_voice(42) == 42
    assert parse_voice(" 42 ") == 42
    assert parse_voice(EMBEDDING) == EMBEDDING


@pytest.mark.parametrize("voice", [True, -1, 2**32, "alice", "", 4.5, None, [1]])
def test_an_unparseable_voice_names_the_voice_field(voice):
    with pytest.raises(InvalidRequest) as caught:
        build(voice=voice)
    assert caught.value.field == "voice"


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"text": ""}, "text"),
        ({"text": "   \n\t"}, "text"),
        ({"text": None}, "text"),
        ({"text": "x" * 101}, "text"),
        ({"format": "aiff"}, "format"),
        ({"speed": 0}, "speed"),
        ({"speed": 10}, "speed"),
        ({"speed": "fast"}, "speed"),
        ({"temperature": 0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"repetition_penalty": 3}, "repetition_penalty"),
        ({"refine_text": "yes"}, "refine_text"),
        ({"refine_text": True, "oral": 10}, "oral"),
        ({"seed": -5}, "seed"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_each_bad_argument_is_refused_naming_its_field(arguments, field):
    with pytest.raises(InvalidRequest) as caught:
        build(**arguments)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_refine_text_carries_its_levels_into_a_chattts_prompt():
    request = build(refine_text=True, oral=3, laugh=1, **{"break": 4})
    assert request.refine_text.prompt == "[oral_3][laugh_1][break_4]"


def test_arguments_round_trip():
    request = build(voice=7, format="mp3", refine_text=True, seed=9)
    assert SynthesisRequest.from_arguments(request.as_arguments(), max_text_chars=100) == request


def test_invalid_request_survives_pickling_and_rebuilding_from_its_args():
    error = InvalidRequest("voice", "is bad")
    assert pickle.loads(pickle.dumps(error)).field == "voice"
    assert str(InvalidRequest(*error.args)) == "voice: is bad"
