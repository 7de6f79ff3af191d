"""Decoding speaker embeddings on the worker: real ones exactly as ChatTTS does, and nothing that
expands past the model's width, whatever the contract let through; blends mixed as ChatTTS uses them."""

import time
import tracemalloc

import numpy as np
import pybase16384
import pytest
import torch
import torch.nn.functional as F
from ChatTTS.model.speaker import Speaker

from chattts_farm.contract import CLIP_SAMPLE_RATE, InvalidRequest, SpeakerSample, SynthesisRequest, parse_voice
from tests.voice_bombs import (
    CHATTTS_PRESET,
    FARM_PRESET,
    compress,
    embedding_text,
    incompressible_embedding,
    voice_bomb,
)
from worker.engine_process.voices import (
    embedding_for_seed,
    embedding_tensor,
    resolve,
    sample_codes,
    speaker_sample,
)


@pytest.fixture(scope="module")
def speaker(synthesizer):
    return synthesizer.model.chat.speaker


def refusal(speaker, embedding: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        embedding_tensor(speaker, embedding)
    assert caught.value.field == "voice"
    return caught.value


def test_real_embeddings_decode_exactly_as_chattts_decodes_them(speaker):
    chattts_own = [Speaker._encode(speaker._sample_random()) for _ in range(5)]
    the_farms = [embedding_for_seed(speaker, seed) for seed in range(5)]
    widest = [incompressible_embedding(speaker.dim, preset) for preset in (FARM_PRESET, CHATTTS_PRESET)]
    for embedding in chattts_own + the_farms:
        expected = torch.from_numpy(Speaker._decode(embedding)).float()
        assert torch.equal(embedding_tensor(speaker, embedding), expected)
    for embedding in widest:  # random bytes: some are not finite, which is refused either way
        values = Speaker._decode(embedding)
        if np.isfinite(values).all():
            assert torch.equal(embedding_tensor(speaker, embedding), torch.from_numpy(values).float())
        else:
            assert "not finite" in refusal(speaker, embedding).message


def test_a_bomb_short_enough_for_the_contract_is_refused_without_expanding(speaker):
    bomb = voice_bomb(8)  # 8 MiB of zeros in a few hundred characters: the length bound lets it in
    tracemalloc.start()
    try:
        error = refusal(speaker, bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"more than {speaker.dim} values" in error.message
    assert peak < 256 * 1024  # expanded, it would have taken 8 MiB


ZEROS = bytes(2 * 64)  # 64 float16 zeros: synthetic-tiny's width


@pytest.mark.parametrize(
    ("data", "fault"),
    [
        (compress(ZEROS)[:-2], "ends early"),
        (compress(ZEROS) + compress(ZEROS), "data after its end"),
        (compress(ZEROS[:-2]), "has 63 values"),
        (compress(ZEROS[:-1]), "odd number of bytes"),
        (b"not lzma at all", "not a valid ChatTTS speaker embedding"),
    ],
    ids=["truncated", "trailing data", "too narrow", "half a value", "not lzma"],
)
def test_broken_embeddings_are_refused_naming_voice(speaker, data, fault):
    assert speaker.dim == 64
    assert fault in refusal(speaker, pybase16384.encode_to_string(data)).message


def test_the_synthesizer_refuses_a_bomb_alone_and_its_batch_mates_are_spoken(synthesizer, make_request):
    requests = [
        make_request("Before the bomb."),
        SynthesisRequest("Boom.", voice=voice_bomb(50)),  # unvalidated: the core refuses it on its own
        SynthesisRequest("Boom.", voice=voice_bomb(8)),
        make_request("After the bomb."),
    ]
    outcomes = synthesizer.synthesize(requests)
    assert [getattr(outcome, "field", None) for outcome in outcomes] == [None, "voice", "voice", None]
    assert outcomes[0].duration_s > 0 and outcomes[3].duration_s > 0


def test_a_blend_is_the_weighted_mean_of_its_voices_at_unit_length_as_chattts_uses_them(speaker):
    first, second = (embedding_tensor(speaker, embedding_for_seed(speaker, seed)) for seed in (1, 2))
    # ChatTTS scales an embedding to unit length before use: eight times the second is the same voice.
    louder_second = embedding_text((second * 8).half().numpy().tobytes())
    blend = {"mix": [{"voice": 1, "weight": 7}, {"voice": louder_second, "weight": 3}]}
    embedding, mixed = resolve(speaker, parse_voice(blend))
    expected = 0.7 * F.normalize(first, dim=0) + 0.3 * F.normalize(second, dim=0)
    # Up to float16's rounding: the blend is written as an embedding string, as every voice is.
    torch.testing.assert_close(F.normalize(mixed, dim=0), F.normalize(expected, dim=0), atol=2e-3, rtol=0)
    raw_mean = 0.7 * first + 0.3 * second * 8
    assert not torch.allclose(F.normalize(mixed, dim=0), F.normalize(raw_mean, dim=0), atol=2e-2)
    assert torch.equal(embedding_tensor(speaker, embedding), mixed)  # the string the result reports is the voice


def test_a_blend_whose_parts_cancel_out_is_refused_naming_voice(speaker):
    voice = embedding_tensor(speaker, embedding_for_seed(speaker, 5))
    opposite = embedding_text((-voice).half().numpy().tobytes())
    blend = {"mix": [{"voice": 5, "weight": 1}, {"voice": opposite, "weight": 1}]}
    with pytest.raises(InvalidRequest) as refused:
        resolve(speaker, parse_voice(blend))
    assert refused.value.field == "voice"


def clip_pcm(seconds: float, seed: int = 0) -> bytes:
    """A clip as the speaker-sample task takes it (noise: synthetic weights hear no words)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * CLIP_SAMPLE_RATE)) * 3000).astype("<i2").tobytes()


def sample_text(shape: tuple[int, int], codes: bytes) -> str:
    """A speaker sample as ChatTTS's Speaker.encode_prompt writes one: its shape, then its LZMA2 codes."""
    return pybase16384.encode_to_string(np.array(shape, dtype="<u2").tobytes() + compress(codes))


def test_a_speaker_sample_is_chattts_own_and_reads_back_as_the_clips_dvae_codes(synthesizer):
    chat = synthesizer.model.chat
    pcm = clip_pcm(2.0)
    sample = speaker_sample(chat, pcm)
    assert sample == chat.sample_audio_speaker(np.frombuffer(pcm, dtype="<i2") / np.float32(32768))
    codes = sample_codes(chat, sample)
    assert torch.equal(codes, chat.speaker.decode_prompt(sample))
    wav = torch.from_numpy(np.frombuffer(pcm, dtype="<i2") / np.float32(32768))
    assert torch.equal(codes, chat.dvae.sample_audio(wav).int().cpu())
    assert codes.shape == (chat.config.gpt.num_vq, 94)  # about 47 steps a second
    assert speaker_sample(chat, pcm) == sample != speaker_sample(chat, clip_pcm(2.0, seed=1))


@pytest.mark.parametrize(
    "shape, codes, what",
    [
        ((4, 1000), b"\0" * (8 << 20), "expands"),  # a bomb: 8 MiB of zeros behind a modest shape
        ((3, 10), b"\1\0" * 30, "codebooks"),
        ((4, 10), b"\1\0" * 30, "holds 30 codes"),
        ((4, 10), b"\x71\x02" * 40, "codes this model lacks"),  # 625: the end of speech
    ],
    ids=["bomb", "codebooks", "short", "eos"],
)
def test_a_speaker_sample_the_model_cannot_speak_is_refused_naming_voice(synthesizer, shape, codes, what):
    started = time.perf_counter()
    with pytest.raises(InvalidRequest, match=what) as refused:
        sample_codes(synthesizer.model.chat, sample_text(shape, codes))
    assert refused.value.field == "voice" and time.perf_counter() - started < 1


def test_a_voice_from_a_reference_clip_speaks_alike_every_time_and_unlike_a_seed(synthesizer):
    chat = synthesizer.model.chat
    clip = SpeakerSample(speaker_sample(chat, clip_pcm(1.5)), "Hello, this is my voice.")

    def spoken(voice):
        request = SynthesisRequest(text="Hello from the farm.", voice=voice, seed=7)
        (outcome,) = synthesizer.synthesize([request])
        assert not isinstance(outcome, Exception), outcome
        return outcome

    first, again, seeded = spoken(clip), spoken(clip), spoken(42)
    assert first.audio == again.audio and first.voice_embedding is None
    assert first.duration_s > 0 and not np.array_equal(first.samples[:2000], seeded.samples[:2000])
    other_clip = SpeakerSample(speaker_sample(chat, clip_pcm(1.5, seed=1)), "Hello, this is my voice.")
    assert spoken(other_clip).audio != first.audio
