"""A process kept alive: started again after a backoff whenever it dies, until it is stopped.

The worker supervisor keeps its Celery workers this way and ``chattts-farm up`` the parts of the farm.
The backoff doubles with each quick death (a part that cannot start does not spin) and starts again
from one second once the process has stayed up a while.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

# A process that lived this long counts as healthy again: its next death restarts it quickly.
HEALTHY_AFTER_S = 60.0
MAX_BACKOFF_S = 60.0
_PR_SET_PDEATHSIG = 1


class KeptAlive:
    """One named process, started by ``start`` (which may raise ``OSError`` or ``restart_errors``:
    such a start counts as a death, and is tried again after the backoff)."""

    def __init__(
        self,
        name: str,
        start: Callable[[], subprocess.Popen],
        restart_errors: tuple[type[Exception], ...] = (),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.name = name
        self._start = start
        self._restart_errors = (OSError, *restart_errors)
        self._clock = clock
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0
        self.restart_at = 0.0
        self.quick_deaths = 0

    def start(self) -> None:
        """Start the process now; a failure propagates (a part that cannot start the first time is an error)."""
        self.process = self._start()
        self.started_at = self._clock()
        logger.info("%s started (pid %d)", self.name, self.process.pid)

    def tend(self) -> None:
        """Notice a death and schedule the restart, or restart when its time has come; call it often."""
        now = self._clock()
        if self.process is None:
            if now >= self.restart_at:
                try:
                    self.start()
                except self._restart_errors as error:
                    self._schedule_restart(now, 0.0, f"could not start again: {error}")
            return
        code = self.process.poll()
        if code is not None:
            lived = now - self.started_at
            self._schedule_restart(now, lived, f"(pid {self.process.pid}) exited with {code} after {lived:.0f} s")

    def _schedule_restart(self, now: float, lived: float, what_happened: str) -> None:
        self.quick_deaths = 1 if lived > HEALTHY_AFTER_S else self.quick_deaths + 1
        delay = min(MAX_BACKOFF_S, 2.0 ** (self.quick_deaths - 1))
        logger.error("%s %s; starting it again in %.0f s", self.name, what_happened, delay)
        self.process = None
        self.restart_at = now + delay

    def signal_stop(self) -> None:
        """Ask the process to stop (SIGTERM: Celery's warm shutdown, gunicorn's graceful one)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self) -> None:
        if self.process is not None:
            self.process.wait()

    def stop(self) -> None:
        self.signal_stop()
        self.wait()


def sigterm_when_this_process_dies() -> Callable[[], None]:
    """A ``preexec_fn`` for children that must not outlive this process, even SIGKILLed: on Linux the
    kernel sends them SIGTERM (a warm shutdown) when it dies, so this process started again does not
    find orphans holding its children's names and ports. Elsewhere it does nothing."""
    parent = os.getpid()

    def in_the_child() -> None:
        if not sys.platform.startswith("linux"):
            return
        ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the request was made
            os.kill(os.getpid(), signal.SIGTERM)

    return in_the_child
