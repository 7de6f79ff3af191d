"""The quality gate flags what makes a segment suspect."""

import numpy as np
import pytest

from worker.vocoder.quality import SampleStats, assess, judge

SPEECH_LIKE = (0.2 * np.sin(np.arange(24_000) / 7)).astype(np.float32)


def test_plausible_audio_passes():
    assert assess(SPEECH_LIKE, 50, 50, "eos").ok


def test_hitting_the_token_limit_is_flagged():
    assert "token_limit" in assess(SPEECH_LIKE, 2048, 50, "token_limit").flags


def test_far_too_long_or_short_is_flagged():
    assert "too_long" in assess(SPEECH_LIKE, 400, 50, "eos").flags
    assert "too_short" in assess(SPEECH_LIKE, 5, 50, "eos").flags


def test_nan_silence_and_clipping_are_flagged():
    assert "nan" in assess(np.array([np.nan, 0.1], dtype=np.float32), 50, 50, "eos").flags
    assert "silence" in assess(np.zeros(24_000, dtype=np.float32), 50, 50, "eos").flags
    assert "clipping" in assess(np.ones(24_000, dtype=np.float32), 50, 50, "eos").flags


def test_an_infinity_is_flagged_as_not_finite():
    with_infinity = SPEECH_LIKE.copy()
    with_infinity[100] = -np.inf
    assert "nan" in assess(with_infinity, 50, 50, "eos").flags


def test_finite_samples_too_loud_to_square_and_add_are_clipping_not_nan():
    flags = assess(np.full(24_000, 1e30, dtype=np.float32), 50, 50, "eos").flags
    assert "nan" not in flags and "clipping" in flags


def test_a_few_clipped_samples_are_within_bounds_and_many_are_not():
    few, many = SPEECH_LIKE.copy(), SPEECH_LIKE.copy()
    few[:100] = 1.0  # 0.4% of the samples
    many[:1_000] = -1.0  # 4%
    assert assess(few, 50, 50, "eos").ok
    assert "clipping" in assess(many, 50, 50, "eos").flags


@pytest.mark.parametrize(
    "samples",
    [
        SPEECH_LIKE,
        np.zeros(24_000, dtype=np.float32),
        np.concatenate([SPEECH_LIKE, np.ones(500, dtype=np.float32)]),  # clipping in its last piece alone
        np.concatenate([SPEECH_LIKE, np.full(24_000, 1e30, dtype=np.float32)]),
        np.concatenate([SPEECH_LIKE[:100], [np.nan], SPEECH_LIKE]).astype(np.float32),
    ],
    ids=["speech", "silence", "clipping", "too loud to square", "nan"],
)
def test_a_segment_judged_piece_by_piece_gets_the_verdict_of_its_whole_audio(samples):
    stats = SampleStats()
    for piece in np.array_split(samples, [0, 1_000, 7_000, 7_000, 20_000]):  # with empty pieces among them
        stats.add(piece)
    assert stats.size == samples.size
    assert judge(stats, 50, 50, "eos") == assess(samples, 50, 50, "eos")
