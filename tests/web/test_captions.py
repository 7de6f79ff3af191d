"""Caption files written from a timeline: cues that no text can break."""

from web.captions import subrip, webvtt

TIMELINE = [
    {"index": 0, "text": "Line one\n\nand --> its\r\nrest", "start_s": 0.0, "end_s": 1.5},
    {"index": 1, "text": "An hour & more <b>in</b>.", "start_s": 3723.25, "end_s": 3725.0},
]


def test_webvtt_escapes_markup_and_arrows_and_keeps_each_cue_on_one_line():
    assert webvtt(TIMELINE) == (
        "WEBVTT\n\n"
        "1\n00:00:00.000 --> 00:00:01.500\nLine one and --&gt; its rest\n\n"
        "2\n01:02:03.250 --> 01:02:05.000\nAn hour &amp; more &lt;b&gt;in&lt;/b&gt;.\n"
    )


def test_subrip_breaks_up_arrows_and_keeps_each_cue_on_one_line():
    assert subrip(TIMELINE) == (
        "1\n00:00:00,000 --> 00:00:01,500\nLine one and -- > its rest\n\n"
        "2\n01:02:03,250 --> 01:02:05,000\nAn hour & more <b>in</b>.\n"
    )
