"""What text the farm accepts and what counts as speakable."""

import re

from chattts_farm.text import drop_invisible, is_speakable, is_ssml, visible_character


def test_speakable_means_letters_or_chinese_characters():
    assert is_speakable("hi")
    assert is_speakable("你")
    assert not is_speakable("123 !!! ...")
    assert not is_speakable("[uv_break] [laugh]")


def test_control_and_invisible_characters_are_dropped_and_whitespace_kept():
    assert drop_invisible("a\x00b\u200bc\u202ed\ufeff\te\nf\x1b[0m\u00adg") == "abcd\te\nfg"


def test_ssml_is_told_from_angle_brackets_in_prose():
    assert is_ssml("<speak>Hi.</speak>") and is_ssml('Hi <break time="1s"/> there.')
    assert is_ssml("<amazon:effect name='whispered'>Psst.</amazon:effect>")
    assert not is_ssml("If a<b and c>d, stop.") and not is_ssml("I <3 you.") and not is_ssml("<https://example.com>")


def test_the_visible_character_pattern_matches_exactly_the_characters_that_survive_dropping_and_stripping():
    # The schema's pattern for names that must keep something visible: a name of characters it does not
    # match is refused, and the API's fuzzer sends such names as valid ones unless the schema says so.
    visible = re.compile(visible_character())
    for code in range(0x10000):
        character = chr(code)
        assert bool(visible.fullmatch(character)) == bool(drop_invisible(character).strip()), hex(code)
