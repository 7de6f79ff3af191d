"""The encoder processes of a worker's Celery process: mp3, Ogg and FLAC encoding off its interpreter.

A pool of ``CHATTTS_FARM_ENCODER_PROCESSES`` processes, started as jobs need them, each ending soon
after the Celery process that started it (:mod:`worker.orphans`).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from chattts_farm.settings import Settings
from worker.orphans import end_with


def encoder_pool(settings: Settings) -> ProcessPoolExecutor | None:
    """The pool, or None where the settings ask for no encoder processes (encoding in the job's thread)."""
    if not settings.encoder_processes:
        return None
    return ProcessPoolExecutor(
        settings.encoder_processes,
        # Spawned, not forked: a fork of a process with many threads may copy a lock some thread held.
        mp_context=multiprocessing.get_context("spawn"),
        initializer=end_with,
        initargs=(os.getpid(),),
    )
