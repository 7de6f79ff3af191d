"""The listener, a thread beside the engine, hears each attempt and judges it against the segment's text."""

import threading
import time

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

    def transcribe_batch(self, clips, sample_rate, expected_texts):
        if isinstance(self.heard, Exception):
            raise self.heard
        return [self.heard] * len(clips)


class HeldHearing(Hearing):
    """Hears what it is told, but holds its first batch until released; keeps the size of each batch."""

    def __init__(self, heard):
        super().__init__(heard)
        self.holding = threading.Event()
        self.release = threading.Event()
        self.batch_sizes = []

    def transcribe_batch(self, clips, sample_rate, expected_texts):
        self.holding.set()
        self.release.wait(timeout=30)
        self.batch_sizes.append(len(clips))
        return super().transcribe_batch(clips, sample_rate, expected_texts)


def an_attempt():
    return Attempt(None, np.zeros(16_000, np.float32), SegmentQuality(10, 10, "eos"))


def heard_by(backend, max_error_rate=0.5):
    listener = Listener(backend, max_error_rate)
    listener.submit(Segment(), an_attempt())
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


def test_a_batch_whose_verdict_fails_is_left_unchecked_and_the_listener_goes_on_hearing():
    class MiscountingOnce(Hearing):
        """Gives its first batch one heard text too many, as no recogniser should."""

        def transcribe_batch(self, clips, sample_rate, expected_texts):
            heard = super().transcribe_batch(clips, sample_rate, expected_texts)
            if not hasattr(self, "miscounted"):
                self.miscounted = True
                return [*heard, "one more"]
            return heard

    listener = Listener(MiscountingOnce("hello there, my two friends"), 0.5)
    listener.submit(Segment(), an_attempt())
    [unchecked] = listener.collect(wait_s=30)
    assert unchecked.check is None
    listener.submit(Segment(), an_attempt())
    [checked] = listener.collect(wait_s=30)
    assert checked.check.passed and listener.pending == 0


def test_only_a_text_with_something_to_say_is_heard():
    listener = Listener(Hearing(""), 0.5)
    assert listener.hears(TEXT) and not listener.hears("[laugh] [uv_break]")
    assert normalise("[laugh] [uv_break]") == ""


def test_the_attempts_waiting_are_heard_together_up_to_the_batch_bound():
    hearing = HeldHearing("hello there, my two friends")
    listener = Listener(hearing, 0.5, max_batch=4)
    listener.submit(Segment(), an_attempt())
    assert hearing.holding.wait(timeout=30)  # the thread took the first alone, and holds it
    for _ in range(6):
        listener.submit(Segment(), an_attempt())
    hearing.release.set()
    heard = []
    deadline = time.monotonic() + 30
    while len(heard) < 7:
        assert time.monotonic() < deadline, f"heard {len(heard)} of 7"
        heard.extend(listener.collect(wait_s=1))
    assert hearing.batch_sizes == [1, 4, 2]
    assert all(item.check.passed for item in heard) and listener.pending == 0
    assert (listener.figures.batches, listener.figures.attempts) == (3, 7) and listener.figures.busy_s > 0
