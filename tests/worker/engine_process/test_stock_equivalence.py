"""The farm speaks as stock ChatTTS does: the same audio tokens, hidden states and decoded samples.

Stock here is ChatTTS's own internals, ``Chat._infer_code`` for one text with one voice and
``Chat._decode_to_wavs``, not ``Chat.infer``: infer then drops every sample with |x| <= 1e-5
anywhere in the wave, which shifts its audio. Both sides sample at a temperature of 1e-4, where the
likeliest token all but always wins, from seeded noise, so that a near tie cannot make the test flaky;
and both run exactly TOKENS steps with EOS blocked: random weights never end on their own. So what
holds here on synthetic-tiny says that the farm speaks as ChatTTS does with the real weights.
"""

import dataclasses

import ChatTTS
import numpy as np
import pytest
import torch

from chattts_farm.contract import CLIP_SAMPLE_RATE, SpeakerSample, SynthesisRequest
from worker.engine.engine import Engine
from worker.engine.segment import Segment, SegmentOutput
from worker.engine_process import voices

TOKENS = 24
# The farm's GPT pass is its own attention over ChatTTS's weights, stock's is transformers' LlamaModel:
# float32 rounding apart (measured up to 5e-7), nothing may differ.
HIDDEN_TOLERANCE = 2e-6


def farm_generate(model, segments: list[Segment]) -> list[SegmentOutput]:
    """The segments through the farm's engine, all running together."""
    engine = Engine(model, slots=len(segments), max_admissions=len(segments), max_prompt_tokens=128, max_new_tokens=64)
    engine.add(segments)
    while engine.has_work:
        engine.step()
    return [segment.output for segment in segments]


def farm_decode(synthesizer, hiddens: list[torch.Tensor]) -> list[np.ndarray]:
    """The farm's decoding of hidden states into samples, as the Synthesizer does it."""
    return synthesizer.vocoder.decode(hiddens)


def near_greedy_request(text, voice, speed, seed=None, **sampling):
    seed = voice if seed is None else seed
    return SynthesisRequest(text=text, voice=voice, speed=speed, temperature=1e-4, seed=seed, **sampling)


# Texts of different prompt lengths, voices, speeds and sampling settings, so that batched together
# they make a padded batch of rows that each sample on their own terms.
REQUESTS = [
    near_greedy_request("hello there farm", voice=42, speed=5),
    near_greedy_request("你好，世界。今天天气不错。", voice=7, speed=3),
    near_greedy_request(
        "The farm reads long documents aloud, 1 segment at a time.",
        voice=1234,
        speed=8,
        top_p=0.5,
        top_k=3,
        repetition_penalty=1.3,
    ),
    near_greedy_request("Short one.", voice=3, speed=1, top_p=0.01, top_k=1, repetition_penalty=1.0),
]


def farm_segment(synthesizer, owner, request) -> Segment:
    """The request's one segment as the Synthesizer prepares it (normalised text, resolved voice, seed),
    run for exactly TOKENS steps."""
    (segment,) = synthesizer.preparer.prepare(owner, request).segments
    return dataclasses.replace(segment, expected_tokens=TOKENS, max_tokens=TOKENS, pinned=True)


@dataclasses.dataclass
class StockOutput:
    text: str
    codes: torch.Tensor
    hiddens: torch.Tensor


def stock_infer_code(chat, request) -> StockOutput:
    """What Chat.infer generates for the request's text, as one piece, without refining."""
    text = chat.normalizer(request.text, True, True)
    sample = request.voice if isinstance(request.voice, SpeakerSample) else SpeakerSample(None, None)
    params = ChatTTS.Chat.InferCodeParams(
        prompt=f"[speed_{request.speed}]",
        spk_emb=voices.spoken_voice(chat, request.voice).embedding,
        spk_smp=sample.spk_smp,
        txt_smp=sample.txt_smp,
        temperature=request.temperature,
        top_P=request.top_p,
        top_K=request.top_k,
        repetition_penalty=request.repetition_penalty,
        min_new_token=TOKENS,
        max_new_token=TOKENS,
        show_tqdm=False,
        manual_seed=request.seed,
    )
    result = next(chat._infer_code([text], False, chat.device, True, params))
    return StockOutput(text.strip(), result.ids[0], result.hiddens[0])


@pytest.fixture(scope="module")
def stock(synthesizer) -> list[StockOutput]:
    return [stock_infer_code(synthesizer.model.chat, request) for request in REQUESTS]


@pytest.fixture(scope="module")
def segments(synthesizer) -> list[Segment]:
    return [farm_segment(synthesizer, owner, request) for owner, request in enumerate(REQUESTS)]


def assert_speaks_as_stock(output: SegmentOutput, stock: StockOutput):
    assert torch.equal(output.codes, stock.codes)
    torch.testing.assert_close(output.hiddens, stock.hiddens, atol=HIDDEN_TOLERANCE, rtol=0)


def test_the_farm_speaks_the_text_stock_speaks(segments, stock):
    assert [segment.text for segment in segments] == [output.text for output in stock]


@pytest.mark.parametrize("row", range(len(REQUESTS)), ids=[r.text for r in REQUESTS])
def test_alone_each_request_draws_stocks_tokens_and_hidden_states(synthesizer, segments, stock, row):
    (output,) = farm_generate(synthesizer.model, [segments[row]])
    assert_speaks_as_stock(output, stock[row])


def test_batched_together_each_row_draws_what_stock_draws_for_it_alone(synthesizer, segments, stock):
    outputs = farm_generate(synthesizer.model, segments)
    for output, expected in zip(outputs, stock, strict=True):
        assert_speaks_as_stock(output, expected)


def test_the_farm_decodes_hidden_states_exactly_as_stock_does(synthesizer, stock):
    hiddens = [output.hiddens for output in stock]
    expected = synthesizer.model.chat._decode_to_wavs(list(hiddens), True)
    for samples, stock_samples in zip(farm_decode(synthesizer, hiddens), expected, strict=True):
        np.testing.assert_array_equal(samples, stock_samples)


@pytest.fixture(scope="module")
def clip_requests(synthesizer) -> list[SynthesisRequest]:
    """Requests in voices from reference clips (1.2 and 1.5 s of noise: synthetic weights hear no words)."""
    rng = np.random.default_rng(11)
    made = []
    for seconds, transcript, text in ((1.2, "This is my voice.", "hello there farm"), (1.5, "你好。", "Short one.")):
        pcm = (rng.standard_normal(int(seconds * CLIP_SAMPLE_RATE)) * 3000).astype("<i2").tobytes()
        sample = SpeakerSample(voices.speaker_sample(synthesizer.model.chat, pcm), transcript)
        made.append(near_greedy_request(text, voice=sample, speed=4, seed=len(made) + 21))
    return made


def test_a_voice_from_a_reference_clip_draws_what_stock_draws_with_that_speaker_sample(synthesizer, clip_requests):
    chat = synthesizer.model.chat
    expected = [stock_infer_code(chat, request) for request in clip_requests]
    plain = [farm_segment(synthesizer, 0, REQUESTS[0])]
    clips = [farm_segment(synthesizer, owner, request) for owner, request in enumerate(clip_requests, 1)]
    for segment, stock_output in zip(clips, expected, strict=True):
        (output,) = farm_generate(synthesizer.model, [dataclasses.replace(segment, prompt_ids=None)])
        assert_speaks_as_stock(output, stock_output)
    # Batched with each other and with a voice of a speaker embedding: prompts of every shape in one pass.
    outputs = farm_generate(synthesizer.model, plain + clips)
    for output, stock_output in zip(outputs[1:], expected, strict=True):
        assert_speaks_as_stock(output, stock_output)
    assert_speaks_as_stock(outputs[0], stock_infer_code(chat, REQUESTS[0]))
