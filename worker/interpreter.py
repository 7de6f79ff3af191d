"""How the worker's processes share their interpreter among their threads, start them, and keep its
garbage collector from stopping them. Torch-free: both sides use it.

Each process of a worker runs one busy thread beside several that mostly wait: the engine process's
batcher beside its channel's reader and sender threads (and the ASR gate's listener), the Celery
process's consumer beside its job threads, its channel's receiver and its stream publisher. A thread
that wakes (a message read, a piece of audio to send) waits for the busy one to let go of the
interpreter, which CPython asks of it only every switch interval: 5 ms by default, at every hop a job's
first audio makes. On an H200 (2026-12-03, thirteenth session; docs/performance.md), one run with
0.5 ms in every process of the farm and the benchmark gave a first chunk at 64 streams of 111 ms at p95
beside 194 with the default, in the same call; runs on other machines since varied too much (135-246
ms at 64 streams, the engine alone too) to settle its share.
"""

from __future__ import annotations

import gc
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, wait

SWITCH_INTERVAL_S = 0.0005


def share_promptly() -> None:
    """Let a waiting thread of this process take the interpreter within SWITCH_INTERVAL_S."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def freeze_start_up_heap() -> None:
    """Collect what start-up left behind, then move every object still alive out of the garbage
    collector's passes for good.

    CPython runs a full pass, over every object it tracks, whenever those that survived earlier passes
    have grown by a quarter. An engine process holds millions from start-up (the model, torch.compile's
    and Triton's, Whisper's): on an H200 a full pass took 0.52 s of the engine's thread in the middle of
    a workload, the GPU idle behind it (bench.asr_cost --timeline, 2026-12-04; docs/performance.md).
    Frozen, they are never scanned again; only what comes later is.
    """
    gc.collect()
    gc.freeze()


def start_threads_ahead(executor: ThreadPoolExecutor, count: int) -> None:
    """Start ``count`` of the executor's threads now and leave them idle, so that no task submitted
    later waits for one to start.

    The executor starts a thread only when a task comes and none is idle, on the thread that submits it,
    which then waits until the new thread has run far enough to say so: each of those waits for the
    interpreter twice. A Celery process's job threads are started so by its consumer's thread, between
    two messages it takes from Redis; so a fresh worker took a burst of jobs in more slowly than one
    that had run a burst before. On the development machine (2 cores; bench.celery_side --jobs 1000
    --hold-s 3, one Celery process, 2026-12-07), a burst of 1,000 jobs reached the engine at p95 in
    1.90-2.17 s with its threads to start, 1.40-1.57 with them started.
    """
    release = threading.Event()
    # Each blocks until all are submitted: none is idle when the next comes, so each starts a thread.
    holding = [executor.submit(release.wait) for _ in range(count)]
    release.set()
    wait(holding)
