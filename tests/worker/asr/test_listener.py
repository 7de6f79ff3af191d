"""The listener, a process beside the engine, hears each attempt and judges it against the segment's text;
if its process dies, the attempts it held come back unchecked and another process hears the next ones.

The recognisers here are scripted (they hear what they are told): they are loaded in the listener's
process, spawned, as the real ones are.
"""

import multiprocessing
import time

import numpy as np
import pytest

from tests.support import running, wait_until
from tests.worker.asr.scripted import DIES, Held, Scripted
from worker.asr.listener import Listener, ListenerFailed
from worker.asr.text import normalise
from worker.engine.segment import Attempt, SegmentQuality

TEXT = "Hello [uv_break] there, my 2 friends."


class Segment:  # what the listener reads of an engine's segment
    index = 0

    def __init__(self, text=TEXT):
        self.text = text

    class request:  # noqa: N801 - stands for the segment's request
        request_id = "job-1"


def an_attempt():
    return Attempt(None, np.zeros(16_000, np.float32), SegmentQuality(10, 10, "eos"))


def collect_all(listener, count):
    heard = []
    deadline = time.monotonic() + 60
    while len(heard) < count:
        assert time.monotonic() < deadline, f"heard {len(heard)} of {count}"
        heard.extend(listener.collect(wait_s=1))
    return heard


def heard_by(recogniser, max_error_rate=0.5):
    listener = Listener(recogniser, max_error_rate)
    try:
        listener.submit(Segment(), an_attempt())
        assert listener.pending == 1
        heard = collect_all(listener, 1)
        assert len(heard) == 1 and listener.pending == 0
        return heard[0].check
    finally:
        listener.close()


def test_the_right_words_pass_however_they_are_written():
    check = heard_by(Scripted(("hello there, my two friends!",)))
    assert check.backend == "scripted" and check.said == TEXT and check.heard == "hello there, my two friends!"
    assert check.error_rate == 0 and check.passed


def test_too_many_missing_words_fail_past_the_maximum_error_rate():
    check = heard_by(Scripted(("hello there",)))
    assert check.error_rate == 0.6 and not check.passed
    assert heard_by(Scripted(("hello there",)), max_error_rate=0.6).passed


def test_a_recogniser_that_fails_leaves_the_attempt_unchecked():
    assert heard_by(Scripted((RuntimeError("out of memory"),))) is None


def test_only_a_text_with_something_to_say_is_heard():
    listener = Listener(Scripted(("",)), 0.5)
    try:
        assert listener.hears(TEXT) and not listener.hears("[laugh] [uv_break]")
        assert normalise("[laugh] [uv_break]") == ""
    finally:
        listener.close()


def test_the_attempts_waiting_are_heard_together_up_to_the_batch_bound():
    manager = multiprocessing.get_context("spawn").Manager()
    held = Held(manager.Event(), manager.Event(), manager.list())
    listener = Listener(Scripted(("hello there, my two friends",), held), 0.5, max_batch=4)
    try:
        listener.submit(Segment(), an_attempt())
        assert held.holding.wait(timeout=30)  # the process took the first alone, and holds it
        for _ in range(6):
            listener.submit(Segment(), an_attempt())
        time.sleep(0.5)  # the six reach the process's queue while it holds the first
        held.release.set()
        heard = collect_all(listener, 7)
        assert list(held.sizes) == [1, 4, 2]
        assert all(item.check.passed for item in heard) and listener.pending == 0
        assert (listener.figures.batches, listener.figures.attempts) == (3, 7) and listener.figures.busy_s > 0
    finally:
        listener.close()
        manager.shutdown()


def test_attempts_held_by_a_process_that_dies_come_back_unchecked_and_another_process_hears_the_next():
    listener = Listener(Scripted(("hello there, my two friends",)), 0.5)
    try:
        first = listener.pid
        listener.submit(Segment(DIES), an_attempt())
        lost = collect_all(listener, 1)
        assert [item.check for item in lost] == [None] and lost[0].segment.text == DIES
        assert listener.pending == 0 and listener.figures.restarts == 1 and listener.pid != first
        listener.submit(Segment(), an_attempt())
        (after,) = collect_all(listener, 1)
        assert after.check.passed
    finally:
        listener.close()


def test_a_recogniser_that_cannot_load_fails_the_listener_with_the_reason():
    with pytest.raises(ListenerFailed, match="OSError: no weights here"):
        Listener(Scripted(fails=True), 0.5)


def test_the_listeners_process_ends_with_the_process_that_started_it():
    """The engine's process killed outright cannot stop its listener; the listener stops itself."""
    context = multiprocessing.get_context("spawn")
    pids = context.Queue()
    starter = context.Process(target=start_a_listener_and_wait, args=(pids,))
    starter.start()
    listener_pid = pids.get(timeout=60)
    starter.kill()
    starter.join()
    wait_until(lambda: not running(listener_pid), 10, "the listener's process to end with its engine's")


def start_a_listener_and_wait(pids):
    listener = Listener(Scripted(("",)), 0.5)
    pids.put(listener.pid)
    time.sleep(120)
