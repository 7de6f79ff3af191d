"""Helper processes that end with the process that started them.

A process killed outright (SIGKILL, the OOM killer) cannot shut its helpers down, and a helper that
waits for work would otherwise wait for good, one set more with every restart.
"""

from __future__ import annotations

import os
import threading
import time

# How often a helper looks whether the process that started it is still there.
PARENT_CHECK_EVERY_S = 1.0


def end_with(parent: int) -> None:
    """End this process soon after process ``parent`` (its parent) has gone."""
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_EVERY_S)
    os._exit(0)
