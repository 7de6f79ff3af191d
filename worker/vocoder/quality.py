"""The quality gate: what makes a synthesised segment suspect, judged from its tokens and samples.

Random or unlucky sampling can make ChatTTS babble to its token limit, fall silent, or blow up; a
flagged segment is generated again with another audio seed (see ``Settings.quality_retries``). The
vocoder's stream (worker.vocoder.stream) judges each whole row as its audio comes back, and a streamed
segment (worker.engine_process.streaming) is judged from its pieces as they go out; the verdict is the
segment's own record (worker.engine.segment.SegmentQuality).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# One rule for the expected speech length, shared with the web's quota reservations.
from chattts_farm.speech_length import TOKENS_PER_SECOND
from worker.engine.segment import SegmentQuality

SILENCE_RMS = 1e-4
CLIPPING_LEVEL = 0.999
CLIPPING_FRACTION = 0.01


@dataclass
class SampleStats:
    """What the gate reads of a segment's samples, added up piece by piece: a streamed segment is judged
    from its pieces as they go out, without joining them."""

    size: int = 0
    energy: float = 0.0  # the sum of the squares (not finite: a NaN, an infinity, or squares too large)
    finite: bool = True
    clipped: int = 0  # samples at CLIPPING_LEVEL or beyond, counted only in pieces that reach it

    def add(self, samples: np.ndarray) -> None:
        if not samples.size:
            return
        self.size += samples.size
        # A few passes over the samples without temporary arrays: at 250 segments a second this runs on
        # the engine's thread (0.3 ms a 10-s segment with np.square, np.abs and np.isfinite's temporaries).
        with np.errstate(over="ignore"):
            energy = float(np.dot(samples, samples))
        self.energy += energy
        # Checked one by one only where the squares did not add up.
        if not np.isfinite(energy) and not np.all(np.isfinite(samples)):
            self.finite = False
            return
        if max(samples.max(), -samples.min()) >= CLIPPING_LEVEL:
            self.clipped += int(np.count_nonzero(np.abs(samples) >= CLIPPING_LEVEL))

    @classmethod
    def of(cls, samples: np.ndarray) -> SampleStats:
        stats = cls()
        stats.add(samples)
        return stats


def assess(samples: np.ndarray, tokens: int, expected: int, ended_by: str) -> SegmentQuality:
    return judge(SampleStats.of(samples), tokens, expected, ended_by)


def judge(stats: SampleStats, tokens: int, expected: int, ended_by: str) -> SegmentQuality:
    """The verdict on a segment whose samples add up to ``stats``."""
    quality = SegmentQuality(tokens=tokens, expected_tokens=expected, ended_by=ended_by)
    if ended_by == "token_limit":
        quality.flags.append("token_limit")
    if tokens > 3 * expected + TOKENS_PER_SECOND:
        quality.flags.append("too_long")
    if tokens < expected / 4:
        quality.flags.append("too_short")
    if not stats.finite:
        quality.flags.append("nan")
        return quality
    if stats.size == 0 or np.sqrt(stats.energy / stats.size) < SILENCE_RMS:
        quality.flags.append("silence")
    elif stats.clipped > CLIPPING_FRACTION * stats.size:
        quality.flags.append("clipping")
    return quality
