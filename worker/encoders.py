"""The encoder processes of a worker's Celery process: mp3, Ogg and FLAC encoding off its interpreter.

A pool of ``CHATTTS_FARM_ENCODER_PROCESSES`` processes, started as jobs need them. Each ends soon after
the Celery process that started it: a Celery process killed (SIGKILL, the OOM killer) cannot shut its
pool down, and its encoders would otherwise wait for work for good, one set more with every restart.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from chattts_farm.settings import Settings

# How often an encoder process looks whether the process that started it is still there.
PARENT_CHECK_EVERY_S = 1.0


def encoder_pool(settings: Settings) -> ProcessPoolExecutor | None:
    """The pool, or None where the settings ask for no encoder processes (encoding in the job's thread)."""
    if not settings.encoder_processes:
        return None
    return ProcessPoolExecutor(
        settings.encoder_processes,
        # Spawned, not forked: a fork of a process with many threads may copy a lock some thread held.
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_end_with,
        initargs=(os.getpid(),),
    )


def _end_with(parent: int) -> None:
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_EVERY_S)
    os._exit(0)
