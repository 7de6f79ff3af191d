"""A kept-alive process is started again after each death, after a backoff that doubles while it keeps
dying quickly, is capped, and starts over once it has stayed up a while."""

import logging
import subprocess
import sys

import pytest

from chattts_farm.kept_alive import HEALTHY_AFTER_S, MAX_BACKOFF_S, KeptAlive

DIES_AT_ONCE = [sys.executable, "-c", "raise SystemExit(3)"]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Flaky(Exception):
    pass


def died(part: KeptAlive) -> None:
    """Let the running process end, then have its death noticed."""
    part.process.wait(timeout=30)
    part.tend()
    assert part.process is None


def test_quick_deaths_double_the_wait_up_to_a_cap_and_every_death_is_logged(caplog):
    clock = Clock()
    part = KeptAlive("web", lambda: subprocess.Popen(DIES_AT_ONCE), clock=clock)
    caplog.set_level(logging.INFO, "chattts_farm.kept_alive")
    part.start()
    assert f"web started (pid {part.process.pid})" in caplog.text
    first_pid = part.process.pid
    waits = []
    for _ in range(8):
        died(part)
        waits.append(part.restart_at - clock.now)
        clock.now = part.restart_at - 0.1
        part.tend()
        assert part.process is None  # not before its time
        clock.now = part.restart_at
        part.tend()
        assert part.process is not None
    part.stop()
    assert waits == [1, 2, 4, 8, 16, 32, MAX_BACKOFF_S, MAX_BACKOFF_S]
    assert f"web (pid {first_pid}) exited with 3 after 0 s; starting it again in 1 s" in caplog.text


def test_a_process_that_stayed_up_a_while_is_started_again_after_a_second():
    clock = Clock()
    part = KeptAlive("flower", lambda: subprocess.Popen(DIES_AT_ONCE), clock=clock)
    part.start()
    for _ in range(3):  # three quick deaths: the next wait would be 8 s
        died(part)
        clock.now = part.restart_at
        part.tend()
    clock.now += HEALTHY_AFTER_S + 1
    died(part)
    assert part.restart_at - clock.now == 1
    part.stop()


def test_a_failed_start_again_counts_as_a_death_and_is_tried_again(caplog):
    clock = Clock()
    attempts = []

    def start() -> subprocess.Popen:
        attempts.append(clock.now)
        if len(attempts) in (2, 3):  # the port is taken for a while after the first death
            raise Flaky("port taken")
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    part = KeptAlive("redis", start, restart_errors=(Flaky,), clock=clock)
    part.start()
    part.process.kill()
    died(part)
    for expected_wait in (2, 4):
        clock.now = part.restart_at
        part.tend()
        assert part.process is None and part.restart_at - clock.now == expected_wait
    assert "redis could not start again: port taken; starting it again in 2 s" in caplog.text
    clock.now = part.restart_at
    part.tend()
    assert part.process.poll() is None
    part.stop()
    assert part.process.returncode == -15 and len(attempts) == 4


def test_a_first_start_that_fails_is_an_error_for_the_caller():
    def start() -> subprocess.Popen:
        raise Flaky("no redis-server")

    with pytest.raises(Flaky):
        KeptAlive("redis", start, restart_errors=(Flaky,)).start()
