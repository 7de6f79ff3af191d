"""How long a text takes to speak: one rule for the worker (the quality gate, the synthetic model's
length rule) and the web (the audio a job reserves against its key's daily quota at submit)."""

from __future__ import annotations

import math
import re

from chattts_farm.text import CJK_CHARACTER

TOKENS_PER_SECOND = 46.875  # one GPT step = 512 samples at 24 kHz

# ChatTTS at speed 5 speaks roughly 15 Latin characters or 4.5 CJK characters a second.
_LATIN_TOKENS_PER_CHAR = 3.0
_CJK_TOKENS_PER_CHAR = 10.0
_LATIN = re.compile(r"[A-Za-z0-9]")


def speed_of_rate(rate: float) -> int:
    """A speaking rate (1 = normal, 2 = twice as fast) as ChatTTS's speed 1..9 (5 = normal): two levels
    per doubling, so 0.25 to 4 spans them all."""
    return max(1, min(9, round(5 + 2 * math.log2(rate))))


def expected_tokens(text: str, speed: int) -> int:
    """How many audio tokens a plausible reading of text at ChatTTS speed 1..9 takes.

    Slower speeds (below 5) read longer, faster ones shorter, by 10% a step.
    """
    weight = _LATIN_TOKENS_PER_CHAR * len(_LATIN.findall(text)) + _CJK_TOKENS_PER_CHAR * len(
        CJK_CHARACTER.findall(text)
    )
    return max(8, round(weight * (1 + 0.1 * (5 - speed))))


def expected_seconds(text: str, speed: int) -> float:
    """The seconds of speech :func:`expected_tokens` stands for. A worker splits a long text into
    segments and joins them with pauses, so a long job's audio runs a little longer than this."""
    return expected_tokens(text, speed) / TOKENS_PER_SECOND
