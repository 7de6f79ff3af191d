"""CPU-bound calls of a web process (libsndfile's encoding and decoding) run on native threads while the
gevent event loop serves the process's other requests.

gevent's own thread pool was tried first, and in one loaded test run a read waited on its answer for
good. So this keeps the parts few and plain: each call gets a native thread of its own (a few tens of
microseconds to start, next to milliseconds of work), reports back through a native lock, and the
waiting greenlet looks at that lock between short sleeps of the loop, with no wake-up across threads to
lose. A call that runs past :data:`CALL_DEADLINE_S` raises :class:`CallStalled` instead of holding its
request for ever. Calls on one object never overlap: a greenlet interrupted while its call runs (a
client that hung up) waits the call out before it goes on to, say, close the file the call still uses.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

_Result = TypeVar("_Result")
log = logging.getLogger(__name__)

# One call is handed about a second of audio, a few milliseconds of work: thirty seconds means a call
# that will not end, and its request is better broken than held.
CALL_DEADLINE_S = 30.0
# How long the waiting greenlet sleeps between looks: short at first (most calls end within a
# millisecond or two), then longer, so a slow call costs the loop little.
_FIRST_LOOK_S = 0.0005
_LAST_LOOK_S = 0.01


class CallStalled(RuntimeError):
    """A call off the loop ran past :data:`CALL_DEADLINE_S`."""


def off_loop(work: Callable[..., _Result], *arguments: Any, **keywords: Any) -> _Result:
    """``work(*arguments, **keywords)`` on a native thread while the calling greenlet waits and the loop
    serves the others; here and now where gevent does not run the process (Flask's test client, a
    script), which has no loop to keep free. At most one call per core runs at once in a process: more
    would only share the cores, and the callers queue for a turn."""
    if not _under_gevent():
        return work(*arguments, **keywords)
    with _turns():
        call = _NativeCall(work, arguments, keywords)
        call.start()
        call.wait()
    return call.outcome()


def _under_gevent() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and monkey.is_module_patched("threading")


@functools.cache
def _turns():
    """The process's turns at the cores, made on first use: in the gunicorn worker, after its fork."""
    from gevent.lock import BoundedSemaphore

    return BoundedSemaphore(os.cpu_count() or 1)


class _NativeCall:
    def __init__(self, work: Callable[..., Any], arguments: tuple, keywords: dict):
        from gevent.monkey import get_original

        self.work, self.arguments, self.keywords = work, arguments, keywords
        self.result: Any = None
        self.error: BaseException | None = None
        self._start_thread = get_original("_thread", "start_new_thread")
        self._done = get_original("_thread", "allocate_lock")()
        self._done.acquire()

    def start(self) -> None:
        self._start_thread(self._run, ())

    def _run(self) -> None:
        try:
            self.result = self.work(*self.arguments, **self.keywords)
        except BaseException as error:  # handed to the waiting greenlet, which raises it
            self.error = error
        finally:
            self._done.release()

    def wait(self) -> None:
        """Until the call ends or runs past its deadline; an exception thrown into the waiting greenlet
        is raised once the call has ended, so that nothing the call uses is touched while it runs."""
        deadline = time.monotonic() + CALL_DEADLINE_S
        interruption: BaseException | None = None
        look = _FIRST_LOOK_S
        while not self._done.acquire(False):
            if time.monotonic() > deadline:
                log.error("%r ran past %.0f s off the loop; its request is broken off", self.work, CALL_DEADLINE_S)
                raise CallStalled(f"a transcoding call ran past {CALL_DEADLINE_S:.0f} s") from interruption
            try:
                time.sleep(look)  # monkey-patched: the loop's sleep, the others run
            except BaseException as error:  # noqa: BLE001 - raised below, once the call is over
                interruption = interruption or error
            look = min(2 * look, _LAST_LOOK_S)
        if interruption is not None:
            raise interruption

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result
