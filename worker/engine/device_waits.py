"""How long this process has waited on the host for its GPU's work.

The engine's thread waits at two places: for a step's state (worker.engine.runner) and for the
vocoder's audio (worker.vocoder). Beside the time that thread spends in the synthesizer's calls (the
batcher counts it), these waits tell a worker bound by its GPU from one bound by its host: on an H200
with 256 streams, py-spy found the engine's thread waiting for the device 105 of the 291 samples it
spent in steps (docs/performance.md).
"""

from __future__ import annotations

import time

_waited_s = 0.0


def wait_for(event) -> None:
    """``event.synchronize()``, counted."""
    global _waited_s
    started = time.perf_counter()
    event.synchronize()
    _waited_s += time.perf_counter() - started


def waited_s() -> float:
    """Seconds spent in :func:`wait_for` since the process started."""
    return _waited_s
