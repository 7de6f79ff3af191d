"""The workers' Celery consumer: :class:`worker.dead_letters.Consumer`, its task events sent in batches.

With task events on (Flower and the ops page read them), Celery's consumer buffers each task event
and sends what its buffer holds at the next turn of its event loop: in a burst, that is one PUBLISH, a
round trip to Redis on the loop's own thread, for almost every job it takes in, between the messages
it pops. This one sends them at most every EVENTS_EVERY_S (and, as Celery does, whenever a buffer holds
24): the events reach Flower up to that much later, and a burst's jobs reach the engine sooner. On the
development machine (2 cores; ``bench.celery_side --jobs 1000 --jobs-in-flight 1024 --hold-s 3``, one
Celery process, 2026-12-07), a burst of 1,000 jobs reached the engine at p95 in 1.46-1.55 s with task
events sent at every turn, 1.01-1.03 s with them sent so, and 1.07-1.08 s with none.
"""

from __future__ import annotations

import time

from worker import dead_letters

EVENTS_EVERY_S = 0.1


class Consumer(dead_letters.Consumer):
    _events_sent_at = 0.0
    _events_due = False  # a send is set for later on the loop's timer

    def _flush_events(self):
        # Called on the event loop's thread (Celery's buffered-event hook schedules it there).
        if self._events_due:
            return  # the timer sends these too
        wait_s = self._events_sent_at + EVENTS_EVERY_S - time.monotonic()
        if wait_s <= 0:
            self._send_events_now()
        else:
            self._events_due = True
            self.hub.call_later(wait_s, self._send_events_now)

    def _send_events_now(self):
        self._events_due = False
        self._events_sent_at = time.monotonic()
        super()._flush_events()
