"""What text the farm accepts and what counts as speakable."""

from chattts_farm.text import drop_invisible, is_speakable, is_ssml


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
