"""The expected speech length: one rule for the worker's quality gate and the web's quota reservations."""

import pytest

from chattts_farm.speech_length import TOKENS_PER_SECOND, expected_seconds, expected_tokens, speed_of_rate


def test_speech_length_counts_latin_letters_digits_and_chinese_characters():
    assert expected_tokens("Hello world 42", 5) == 3 * 12
    assert expected_tokens("你好", 5) == 10 * 2
    assert expected_tokens("...", 5) == 8  # never less than a few steps
    assert expected_tokens("hello world", 3) > expected_tokens("hello world", 5) > expected_tokens("hello world", 7)


def test_expected_seconds_are_the_expected_tokens_at_the_models_step_rate():
    assert expected_seconds("Hello world 42", 5) == pytest.approx(36 / TOKENS_PER_SECOND)


def test_a_speaking_rate_is_two_chattts_speed_levels_a_doubling_within_its_nine():
    assert [speed_of_rate(rate) for rate in (0.25, 0.5, 1.0, 2.0, 4.0)] == [1, 3, 5, 7, 9]
    assert speed_of_rate(0.1) == 1 and speed_of_rate(10) == 9
