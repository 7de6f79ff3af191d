"""The task contract: what a valid request is, and how a bad one is named."""

import pickle
import re
import time
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chattts_farm.contract import (
    DEFAULT_VOICE_SEED,
    MAX_EMBEDDING_CHARS,
    MAX_MIX_PARTS,
    MAX_SAMPLE_CHARS,
    MAX_SPEAKER_DIM,
    OPENAI_VOICE_SEEDS,
    Blend,
    InvalidRequest,
    MixPart,
    SpeakerSample,
    SynthesisRequest,
    parse_voice,
    transcript_of,
    voice_argument,
)
from chattts_farm.text import is_speakable
from tests.edge_texts import EDGE_TEXTS
from tests.support import OPENAI_VOICES
from tests.voice_bombs import CHATTTS_PRESET, FARM_PRESET, incompressible_embedding, voice_bomb

EMBEDDING = "蘁淰敕欀" * 8


def build(**arguments):
    return SynthesisRequest.from_arguments({"text": "Hello.", **arguments}, max_text_chars=100)


def test_defaults_follow_the_contract():
    request = build()
    assert (request.voice, request.format, request.speed) == (DEFAULT_VOICE_SEED, "wav", 5)
    assert (request.temperature, request.top_p, request.top_k) == (0.3, 0.7, 20)
    assert request.refine_text is None and request.seed is None
    assert request.priority == "normal"


def test_a_voice_is_a_seed_or_an_embedding_string():
    assert parse_voice(42) == 42
    assert parse_voice(" 42 ") == 42
    assert parse_voice(EMBEDDING) == EMBEDDING


def test_every_openai_voice_name_is_a_fixed_seed_of_its_own_for_every_caller_of_the_contract():
    seeds = {name: build(voice=name).voice for name in OPENAI_VOICES}
    assert all(isinstance(seed, int) for seed in seeds.values()) and len(set(seeds.values())) == len(OPENAI_VOICES)
    assert seeds["alloy"] == 390_000_000 and seeds["verse"] == 4_290_000_000  # the README's table
    assert set(OPENAI_VOICE_SEEDS) == set(OPENAI_VOICES)  # the one table: exactly OpenAI's names
    assert parse_voice(" nova ") == seeds["nova"]


def test_a_blend_is_its_voices_each_read_as_a_voice_with_its_weight_one_when_left_out():
    blend = parse_voice(
        {"mix": [{"voice": "nova", "weight": 0.7}, {"voice": " 42 ", "weight": 0}, {"voice": EMBEDDING}]}
    )
    assert blend == Blend((MixPart(OPENAI_VOICE_SEEDS["nova"], 0.7), MixPart(42, 0.0), MixPart(EMBEDDING, 1.0)))
    request = build(voice={"mix": [{"voice": 7, "weight": 3}]})
    assert request.voice == Blend((MixPart(7, 3.0),)) and request.voice_seed is None
    # What the worker is sent reads back as the same request (as any request's arguments do).
    assert SynthesisRequest.from_arguments(request.as_arguments(), max_text_chars=100) == request
    assert request.as_arguments()["voice"] == {"mix": [{"voice": 7, "weight": 3.0}]}


@pytest.mark.parametrize(
    ("mix", "why"),
    [
        ([{"voice": 1, "weight": -0.5}, {"voice": 2, "weight": 1}], "part 1 of the blend: weight: must be between"),
        ([{"voice": 1, "weight": 0}, {"voice": 2, "weight": 0.0}], "a weight above 0 on at least one"),
        ([{"voice": 1, "weight": float("nan")}], "part 1 of the blend: weight: must be a number"),
        ([{"voice": 1, "weight": 1001}], "weight: must be between 0.0 and 1000.0"),
        ([{"voice": 1}, {"voice": "alice"}], "part 2 of the blend: voice: must be an integer seed, an OpenAI voice"),
        ([{"voice": seed} for seed in range(MAX_MIX_PARTS + 1)], f"with 1 to {MAX_MIX_PARTS} voices"),
        ([], f"with 1 to {MAX_MIX_PARTS} voices"),
        ([{"voice": {"mix": [{"voice": 1}]}}], "part 1 of the blend must be one seed or embedding voice"),
        ([{"voice": 1, "weight": 1, "gain": 2}], "part 1 of the blend must be an object with a voice and a weight"),
        ([{"weight": 1}], "part 1 of the blend must be an object with a voice"),
        ("alloy(2)+nova(1)", "a blend is"),  # Kokoro's form is the OpenAI endpoint's, not the contract's
    ],
)
def test_a_blend_that_is_no_mix_of_voices_is_refused_naming_the_voice(mix, why):
    with pytest.raises(InvalidRequest, match=re.escape(why)) as caught:
        build(voice={"mix": mix})
    assert caught.value.field == "voice"


def test_a_blend_holds_nothing_but_its_mix():
    with pytest.raises(InvalidRequest, match="a blend is") as caught:
        parse_voice({"mix": [{"voice": 1}], "normalise": False}, "voices")
    assert caught.value.field == "voices"


@pytest.mark.parametrize("voice", ["Alloy", "ALLOY", "allo", "alloy2"])
def test_openai_voice_names_are_taken_as_openai_writes_them_only(voice):
    with pytest.raises(InvalidRequest, match="an OpenAI voice name \\(alloy, ash, ") as caught:
        build(voice=voice)
    assert caught.value.field == "voice"


SAMPLE = "丸丒墷亊乨世㴊仗臛乿丿产袳瞤綉乏丑苅五憐"


def test_a_voice_from_a_reference_clip_is_its_speaker_sample_and_words_and_reads_back_as_written():
    request = build(voice={"spk_smp": SAMPLE, "txt_smp": " My [Stts]own\u200b words. "})
    assert request.voice == SpeakerSample(SAMPLE, "My own words.")
    assert parse_voice(voice_argument(request.voice)) == request.voice
    assert build(**request.as_arguments()) == request


@pytest.mark.parametrize(
    "voice",
    [
        {"spk_smp": SAMPLE},
        {"spk_smp": SAMPLE, "txt_smp": "words", "extra": 1},
        {"spk_smp": "not a sample", "txt_smp": "words"},
        {"spk_smp": "丸" * (MAX_SAMPLE_CHARS + 1), "txt_smp": "words"},
        {"spk_smp": SAMPLE, "txt_smp": "  "},
        {"spk_smp": SAMPLE, "txt_smp": "[spk_emb][Ptts]"},
        {"mix": [{"voice": {"spk_smp": SAMPLE, "txt_smp": "words"}}]},
    ],
    ids=["no words", "extra", "not a sample", "too long", "blank words", "tags only", "in a blend"],
)
def test_a_reference_clip_voice_that_is_not_one_is_refused_naming_the_voice(voice):
    with pytest.raises(InvalidRequest) as caught:
        build(voice=voice)
    assert caught.value.field == "voice"


@pytest.mark.parametrize("transcript", [None, "", "12 34", "x" * 501, 7])
def test_a_transcript_without_words_or_too_long_names_transcript(transcript):
    with pytest.raises(InvalidRequest) as caught:
        transcript_of(transcript)
    assert caught.value.field == "transcript"


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
        ({"priority": "urgent"}, "priority"),
        ({"priority": 1}, "priority"),
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
    request = build(voice=7, format="mp3", refine_text=True, seed=9, priority="bulk")
    assert SynthesisRequest.from_arguments(request.as_arguments(), max_text_chars=100) == request


def test_invalid_request_survives_pickling_and_rebuilding_from_its_args():
    error = InvalidRequest("voice", "is bad")
    assert pickle.loads(pickle.dumps(error)).field == "voice"
    assert str(InvalidRequest(*error.args)) == "voice: is bad"


@pytest.mark.parametrize(("text", "refusal"), EDGE_TEXTS.values(), ids=EDGE_TEXTS.keys())
def test_awkward_text_is_cleaned_for_speech_or_refused_naming_text(text, refusal):
    if refusal is None:
        spoken = SynthesisRequest.from_arguments({"text": text}, max_text_chars=5000).text
        assert is_speakable(spoken)
        assert all(char.isspace() or unicodedata.category(char) not in ("Cc", "Cf") for char in spoken)
    else:
        with pytest.raises(InvalidRequest, match=refusal) as caught:
            SynthesisRequest.from_arguments({"text": text}, max_text_chars=5000)
        assert caught.value.field == "text"


def test_terminal_colour_codes_are_dropped_whole():
    assert build(text="\x1b[1;31mAlert\x1b[0m: disk full.").text == "Alert: disk full."


@pytest.mark.parametrize("preset", [0, FARM_PRESET, 6, CHATTTS_PRESET])
def test_an_embedding_of_the_widest_speaker_fits_the_length_bound_at_any_preset(preset):
    longest = max((incompressible_embedding(MAX_SPEAKER_DIM, preset) for _ in range(20)), key=len)
    assert parse_voice(longest) == longest
    assert len(longest) < 0.85 * MAX_EMBEDDING_CHARS  # room for other encoders


def test_a_voice_bomb_is_refused_by_its_length_before_anything_decodes_it():
    bomb = voice_bomb(50)  # 50 MiB of zeros in under 5,000 characters
    started = time.perf_counter()
    with pytest.raises(InvalidRequest, match=f"at most {MAX_EMBEDDING_CHARS} characters") as caught:
        build(voice=bomb)
    assert caught.value.field == "voice"
    assert time.perf_counter() - started < 0.05
    assert bomb not in str(caught.value)


def test_a_seed_string_is_ascii_digits_and_one_too_long_for_a_seed_is_out_of_range():
    assert parse_voice("0042") == 42
    for voice in ("²", "٣", "9" * 5000):
        with pytest.raises(InvalidRequest):
            parse_voice(voice)


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()
    | st.text(st.characters(codec=None) | st.characters(categories=["Cs"]))
)
ARGUMENT_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
VALUES_NEAR_THE_CONTRACT = {
    "text": st.text(min_size=1) | st.sampled_from([text for text, _ in EDGE_TEXTS.values()]),
    "voice": st.integers(-1, 2**32)
    | st.just(EMBEDDING)
    | st.from_regex(r"\s*[0-9]{1,12}\s*", fullmatch=True)
    | st.integers(4000, 5000).map(lambda digits: "9" * digits)
    | st.text(st.characters(categories=["Nd", "No"]))
    | st.fixed_dictionaries(
        {
            "mix": st.lists(
                st.fixed_dictionaries(
                    {"voice": st.integers(-1, 2**32) | st.sampled_from([EMBEDDING, "alloy", "alice"])},
                    optional={"weight": st.floats(-1, 1001) | st.sampled_from([0, 1, True])},
                ),
                max_size=MAX_MIX_PARTS + 1,
            )
        }
    ),
    "format": st.sampled_from(["wav", "FLAC", "ogg", "mp3", "aiff", ""]),
    "speed": st.integers(0, 10) | st.floats(0, 10),
    "temperature": st.floats(0, 3),
    "top_p": st.floats(0, 1.5),
    "top_k": st.integers(0, 700),
    "repetition_penalty": st.floats(0.5, 2.5),
    "refine_text": st.booleans(),
    "oral": st.integers(-1, 10),
    "laugh": st.integers(-1, 3),
    "break": st.integers(-1, 8),
    "seed": st.none() | st.integers(-1, 2**32),
}
# Known arguments holding values near (or far from) what they take, and a few unknown ones.
ARGUMENTS = st.builds(
    lambda unknown, known: {**unknown, **known},
    st.dictionaries(st.text(max_size=12), ARGUMENT_VALUES, max_size=2),
    st.fixed_dictionaries(
        {}, optional={name: values | ARGUMENT_VALUES for name, values in VALUES_NEAR_THE_CONTRACT.items()}
    ),
)


@settings(max_examples=400, deadline=None)
@given(ARGUMENTS)
def test_any_arguments_are_a_request_the_worker_rebuilds_alike_or_an_invalid_request_naming_one(arguments):
    try:
        request = SynthesisRequest.from_arguments(arguments, max_text_chars=2000)
    except InvalidRequest as error:
        assert error.field in {*arguments, "text"}
        assert str(error).startswith(f"{error.field}: ")
        return
    assert is_speakable(request.text) and len(request.text) <= 2000
    # The web validates a request, then its worker validates the same arguments again.
    assert SynthesisRequest.from_arguments(request.as_arguments(), max_text_chars=2000) == request
