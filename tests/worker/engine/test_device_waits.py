"""The time a process waits on the host for its GPU is counted where it waits."""

import time

from worker.engine import device_waits


class Event:
    """A CUDA event's stand-in (no GPU here) that the device reaches after ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.synchronized = False

    def synchronize(self):
        time.sleep(self.seconds)
        self.synchronized = True


def test_waiting_for_an_event_synchronises_it_and_adds_the_wait_to_the_count():
    before = device_waits.waited_s()
    event = Event(0.05)
    device_waits.wait_for(event)
    assert event.synchronized
    assert 0.05 <= device_waits.waited_s() - before < 1.0
