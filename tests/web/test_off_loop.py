"""Calls off the event loop: under gevent (as gunicorn runs the web) a call runs on a native thread while
the loop serves the others, its errors reach the caller, a call that never ends is broken off, and a
caller interrupted mid-call waits the call out. Each gevent case runs in a fresh Python process, monkey
-patched as a gunicorn gevent worker is, since patching the test process itself would change every
other test's threads."""

import json
import subprocess
import sys
import threading
import time

import pytest

from web import off_loop

_GEVENT_CASES = r"""
from gevent import monkey

monkey.patch_all()

import json
import sys
import threading
import time

import gevent

from web import off_loop

native_sleep = monkey.get_original("time", "sleep")
native_thread_id = monkey.get_original("threading", "get_native_id")


def blocking(seconds):
    native_sleep(seconds)
    return native_thread_id()


def case_runs_on_another_thread_while_the_loop_ticks():
    ticks = []
    ticker = gevent.spawn(lambda: [ticks.append(gevent.sleep(0.01)) for _ in range(1000)])
    worker_thread = off_loop.off_loop(blocking, 0.3)
    ticker.kill()
    return {"ticks": len(ticks), "same_thread": worker_thread == native_thread_id()}


def case_errors_reach_the_caller():
    def failing():
        raise ValueError("the stored audio is not mono")

    try:
        off_loop.off_loop(failing)
    except ValueError as error:
        return {"raised": type(error).__name__, "message": str(error)}
    return {"raised": None}


def case_a_call_that_never_ends_is_broken_off():
    off_loop.CALL_DEADLINE_S = 0.2
    started = time.monotonic()
    try:
        off_loop.off_loop(blocking, 5)
    except off_loop.CallStalled as error:
        stalled = {"raised": type(error).__name__, "after_s": time.monotonic() - started}
    else:
        stalled = {"raised": None}
    # Every turn is back: as many quick calls as the process has turns all run at once.
    quick = [gevent.spawn(off_loop.off_loop, blocking, 0.05) for _ in range(off_loop._turns().counter)]
    gevent.joinall(quick, timeout=2)
    return {**stalled, "quick_calls_done": sum(greenlet.successful() for greenlet in quick), "quick_calls": len(quick)}


def case_an_interrupted_caller_waits_the_call_out():
    call_ended = []

    def slow():
        native_sleep(0.3)
        call_ended.append(time.monotonic())

    caller = gevent.spawn(off_loop.off_loop, slow)
    gevent.sleep(0.05)
    caller.kill()  # as gevent does to a greenlet whose client hung up
    killed = time.monotonic()
    return {"call_had_ended": bool(call_ended) and call_ended[0] <= killed, "caller_dead": caller.dead}


print(json.dumps(globals()["case_" + sys.argv[1]]()))
"""


def run_under_gevent(case: str) -> dict:
    finished = subprocess.run(
        [sys.executable, "-c", _GEVENT_CASES, case], capture_output=True, text=True, timeout=60, check=False
    )
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout)


def test_under_gevent_a_call_runs_on_a_native_thread_while_the_loop_serves_the_others():
    outcome = run_under_gevent("runs_on_another_thread_while_the_loop_ticks")
    assert not outcome["same_thread"]
    # 0.3 s of a blocked call, ticks of 10 ms: a loop held by the call would have ticked at most once.
    assert outcome["ticks"] >= 10, outcome


def test_under_gevent_a_calls_error_is_raised_to_its_caller():
    assert run_under_gevent("errors_reach_the_caller") == {
        "raised": "ValueError",
        "message": "the stored audio is not mono",
    }


def test_under_gevent_a_call_past_its_deadline_is_broken_off_and_gives_its_turn_back():
    outcome = run_under_gevent("a_call_that_never_ends_is_broken_off")
    assert outcome["raised"] == "CallStalled" and outcome["after_s"] < 2, outcome
    assert outcome["quick_calls_done"] == outcome["quick_calls"] >= 1, outcome


def test_under_gevent_a_caller_interrupted_mid_call_goes_on_only_once_the_call_has_ended():
    assert run_under_gevent("an_interrupted_caller_waits_the_call_out") == {"call_had_ended": True, "caller_dead": True}


def test_without_gevent_a_call_runs_here_and_now():
    caller = threading.get_native_id()
    assert off_loop.off_loop(threading.get_native_id) == caller
    with pytest.raises(ZeroDivisionError):
        off_loop.off_loop(lambda: 1 / 0)
    started = time.monotonic()
    off_loop.off_loop(time.sleep, 0.05)
    assert time.monotonic() - started >= 0.05
