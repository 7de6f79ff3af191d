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
    # A few passes over the samples without temporary arrays: at 250 segments a second this runs on the
    # engine's thread (0.3 ms a 10-s segment with np.square, np.abs and np.isfinite's temporaries).
    with np.errstate(over="ignore"):
        energy = float(np.dot(samples, samples)) if samples.size else 0.0
    # Not finite: a NaN or an infinity in the samples, or squares too large to add up (still checked one by one).
    if not np.isfinite(energy) and not np.all(np.isfinite(samples)):
        quality.flags.append("nan")
        return quality
    if samples.size == 0 or np.sqrt(energy / samples.size) < SILENCE_RMS:
        quality.flags.append("silence")
    elif max(samples.max(), -samples.min()) >= CLIPPING_LEVEL and (
        np.count_nonzero(np.abs(samples) >= CLIPPING_LEVEL) > CLIPPING_FRACTION * samples.size
    ):
        quality.flags.append("clipping")
    return quality
