"""What was said and what was heard are normalised alike and compared by words, or characters for Chinese."""

import pytest

from worker.asr.text import error_rate, normalise, says_something


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("Hello, World!", "hello world"),
        ("Hello [uv_break] there [laugh], friend [lbreak]", "hello there friend"),
        ("ＨＥＬＬＯ　ｗｏｒｌｄ！［laugh］", "hello world"),
        ("I have 42 apples and 3.5 pears.", "i have forty two apples and three point five pears"),
        ("Don't 'quote' me.", "don't quote me"),
        ("你好，我有12个苹果。[uv_break]", "你好 我有十二个苹果"),
    ],
)
def test_case_punctuation_tags_full_width_forms_and_numbers_are_normalised(text, normalised):
    assert normalise(text) == normalised


@pytest.mark.parametrize(
    "text",
    [
        "Hello",
        "[uv_break] [laugh]",
        "... !!! ???",
        "_ __ '",
        "'tis",
        "42",
        "[laugh] 7 [lbreak]",
        "\u2121",  # a telephone sign: NFKC makes it TEL
        "x\u00b2",
        "\u00b2",  # a superscript two: NFKC makes it a digit
        "。，！",
        "你好。",
        "\U0001f600 \U0001f600",
        "ＡＢＣ",
        "[[x]]",
        "",
    ],
)
def test_whether_a_text_says_something_is_whether_normalising_leaves_anything(text):
    assert says_something(text) == bool(normalise(text))


def test_english_is_compared_by_words():
    assert error_rate("the cat sat down", "the cat sat down") == 0
    assert error_rate("the cat sat down", "the cat down") == 0.25
    assert error_rate("the cat sat down", "the cat sat sat down") == 0.25


def test_chinese_is_compared_by_characters_whatever_the_spaces():
    assert error_rate("你好 世界", "你好世界") == 0
    assert error_rate("你好世界", "你好") == 0.5
