"""What the benchmarks ask for: texts of a chosen length, the standard workload, and one request
through stock ChatTTS.

Import it after :func:`worker.cuda.configure_allocator` has run (it imports torch through
:mod:`worker.engine_process.voices`).
"""

from __future__ import annotations

import random

from chattts_farm.contract import SynthesisRequest
from chattts_farm.speech_length import TOKENS_PER_SECOND, expected_tokens
from worker.audio import SAMPLE_RATE
from worker.engine_process.voices import embedding_for_seed

WORDS = ["farm", "batch", "voice", "speech", "queue", "worker", "model", "token", "audio", "sample", "steady", "clear"]

# The standard workload: segments of 5-15 s of speech (uniform, mean 10 s), in these voices.
STANDARD_SECONDS = (5.0, 15.0)
STANDARD_VOICES = (2222, 42, 7, 1234, 4099, 31337)
# 15 s of speech is ~700 tokens, ~290 characters of WORDS: past the default max_segment_chars (120),
# which would split a text into several segments. The standard workload keeps each text one segment.
STANDARD_SEGMENT_CHARS = 400


def text_for_tokens(tokens: int, variant: int) -> str:
    """An English text the length rule reads as (close to) ``tokens`` tokens; variants differ in words."""
    words = []
    index = variant
    while expected_tokens(" ".join(words), 5) < tokens:
        words.append(WORDS[index % len(WORDS)])
        index += 1
    return " ".join(words) + "."


def standard_requests(
    count: int, *, seed: int = 0, seconds: tuple[float, float] = STANDARD_SECONDS
) -> list[SynthesisRequest]:
    """``count`` requests of the standard workload, the same for the same ``seed``.

    Each text is one sentence whose expected speech (the synthetic length rule, at speed 5) lasts a
    duration drawn uniformly from ``seconds`` (rounded up to a whole word, under half a second);
    voices are drawn from :data:`STANDARD_VOICES`; every request has its own fixed audio seed.
    """
    draw = random.Random(seed)
    requests = []
    for number in range(count):
        tokens = round(draw.uniform(*seconds) * TOKENS_PER_SECOND)
        text = text_for_tokens(tokens, draw.randrange(len(WORDS)))
        if len(text) > STANDARD_SEGMENT_CHARS:
            raise ValueError(f"{tokens} tokens need {len(text)} characters: more than one segment holds")
        requests.append(
            SynthesisRequest(
                text=text,
                voice=draw.choice(STANDARD_VOICES),
                seed=draw.randrange(2**32),
                request_id=f"standard-{seed}-{number}",
            )
        )
    return requests


def stock_infer(chat, request: SynthesisRequest, tokens: int | None) -> float:
    """``request`` through stock ``Chat.infer``, as ChatTTS's own web UI and API run it: its audio seconds.

    ``tokens`` pins the length (``min_new_token == max_new_token``), which random weights need since
    they never end on their own; None lets the model end where it ends.
    """
    import ChatTTS

    params = ChatTTS.Chat.InferCodeParams(
        spk_emb=embedding_for_seed(chat.speaker, request.voice),
        temperature=request.temperature,
        top_P=request.top_p,
        top_K=request.top_k,
        repetition_penalty=request.repetition_penalty,
        min_new_token=tokens or 0,
        max_new_token=tokens or 2048,
        show_tqdm=False,
        manual_seed=request.seed,
    )
    wavs = chat.infer([request.text], skip_refine_text=True, split_text=False, params_infer_code=params)
    return len(wavs[0]) / SAMPLE_RATE
