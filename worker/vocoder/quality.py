"""The quality gate: what makes a synthesised segment suspect, judged from its tokens and samples.

Random or unlucky sampling can make ChatTTS babble to its token limit, fall silent, or blow up; a
flagged segment is generated again with another audio seed (see ``Settings.quality_retries``). The
vocoder's stream (worker.vocoder.stream) judges each whole row as its audio comes back; the verdict is
the segment's own record (worker.engine.segment.SegmentQuality).
"""

from __future__ import annotations

import numpy as np

# One rule for the expected speech length, shared with the web's quota reservations.
from chattts_farm.speech_length import TOKENS_PER_SECOND
from worker.engine.segment import SegmentQuality

SILENCE_RMS = 1e-4
CLIPPING_LEVEL = 0.999
CLIPPING_FRACTION = 0.01


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
