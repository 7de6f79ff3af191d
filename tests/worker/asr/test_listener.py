"""The listener, a thread beside the engine, hears each attempt and judges it against the segment's text."""

import numpy as np

from worker.asr.listener import Listener
from worker.asr.text import normalise
from worker.engine.segment import Attempt, SegmentQuality

TEXT = "Hello [uv_break] there, my 2 friends."


class Segment:  # what the listener reads of an engine's segment
    text = TEXT
    index = 0

    class request:  # noqa: N801 - stands for the segment's request
        request_id = "job-1"


class Hearing:
    name = "scripted"

    def __init__(self, heard):
        self.heard = heard

    def hears(self, text):
        return True

    def transcribe(self, samples, sample_rate, expected_text):
        if isinstance(self.heard, Exception):
            raise self.heard
        return self.heard


def heard_by(backend, max_error_rate=0.5):
    listener = Listener(backend, max_error_rate)
    listener.submit(Segment(), Attempt(None, np.zeros(16_000, np.float32), SegmentQuality(10, 10, "eos")))
    assert listener.pending == 1
    heard = listener.collect(wait_s=30)
    assert len(heard) == 1 and listener.pending == 0
    return heard[0].check


def test_the_right_words_pass_however_they_are_written():
    check = heard_by(Hearing("hello there, my two friends!"))
    assert check.backend == "scripted" and check.said == TEXT and check.heard == "hello there, my two friends!"
    assert check.error_rate == 0 and check.passed


def test_too_many_missing_words_fail_past_the_maximum_error_rate():
    check = heard_by(Hearing("hello there"))
    assert check.error_rate == 0.6 and not check.passed
    assert heard_by(Hearing("hello there"), max_error_rate=0.6).passed


def test_a_recogniser_that_fails_leaves_the_attempt_unchecked():
    assert heard_by(Hearing(RuntimeError("out of memory"))) is None


def test_only_a_text_with_something_to_say_is_heard():
    listener = Listener(Hearing(""), 0.5)
    assert listener.hears(TEXT) and not listener.hears("[laugh] [uv_break]")
    assert normalise("[laugh] [uv_break]") == ""
