"""The quality gate: what makes a synthesised segment suspect, judged from its tokens and samples.

Random or unlucky sampling can make ChatTTS babble to its token limit, fall silent, or blow up; a
flagged segment is generated again with another audio seed (see ``Settings.quality_retries``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from chattts_farm.text import CJK_CHARACTER

TOKENS_PER_SECOND = 46.875  # one GPT step = 512 samples at 24 kHz

# Expected speech rate used both by the gate and by the synthetic model's length rule: ChatTTS at
# speed 5 speaks roughly 15 Latin characters or 4.5 CJK characters a second.
_LATIN_TOKENS_PER_CHAR = 3.0
_CJK_TOKENS_PER_CHAR = 10.0
_LATIN = re.compile(r"[A-Za-z0-9]")

SILENCE_RMS = 1e-4
CLIPPING_LEVEL = 0.999
CLIPPING_FRACTION = 0.01


def expected_tokens(text: str, speed: int) -> int:
    """How many audio tokens a plausible reading of text at ChatTTS speed 1..9 takes.

    Slower speeds (below 5) read longer, faster ones shorter, by 10% a step.
    """
    weight = _LATIN_TOKENS_PER_CHAR * len(_LATIN.findall(text)) + _CJK_TOKENS_PER_CHAR * len(
        CJK_CHARACTER.findall(text)
    )
    return max(8, round(weight * (1 + 0.1 * (5 - speed))))


@dataclass
class SegmentQuality:
    tokens: int
    expected_tokens: int
    ended_by: str  # "eos" | "length_rule" | "token_limit" | "interrupted"
    flags: list[str] = field(default_factory=list)
    retried: bool = False

    @property
    def ok(self) -> bool:
        return not self.flags


def assess(samples: np.ndarray, tokens: int, expected: int, ended_by: str) -> SegmentQuality:
    quality = SegmentQuality(tokens=tokens, expected_tokens=expected, ended_by=ended_by)
    if ended_by == "token_limit":
        quality.flags.append("token_limit")
    if tokens > 3 * expected + TOKENS_PER_SECOND:
        quality.flags.append("too_long")
    if tokens < expected / 4:
        quality.flags.append("too_short")
    if not np.all(np.isfinite(samples)):
        quality.flags.append("nan")
        return quality
    if samples.size == 0 or float(np.sqrt(np.mean(np.square(samples)))) < SILENCE_RMS:
        quality.flags.append("silence")
    elif float(np.mean(np.abs(samples) >= CLIPPING_LEVEL)) > CLIPPING_FRACTION:
        quality.flags.append("clipping")
    return quality
