"""What an engine process reports of itself in each status message: its batcher's counts, its quality
gates' and how its memory caches grew. Torch-free: the engine process keeps them, and a worker's Celery
side starts from their zeros until the first status comes (worker.engine_client)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class BatcherStats:
    batches: int = 0  # engine steps run
    jobs_done: int = 0
    current_batch: int = 0  # jobs in flight now
    last_batch_size: int = 0  # how many jobs shared the GPU with the last one done
    # The engine's thread in the synthesizer's calls (adding jobs, steps), and of that time how much it
    # waited for the device: the rest is the host's own work (see worker.engine.device_waits).
    in_steps_s: float = 0.0
    waiting_for_device_s: float = 0.0


@dataclass
class GateCounts:
    """What the quality gates have done since the synthesizer started."""

    asr_checks: int = 0  # attempts the ASR gate heard
    asr_mismatches: int = 0  # of those, heard saying something else
    regenerated: int = 0  # segments generated again with another seed, by either gate


@dataclass
class MemoryGrowth:
    """How torch's memory caches grew: the pinned host blocks (where the vocoder's rows land) it had to make
    because none of its cached ones fitted, and the seconds that took on the thread that asked, the
    engine's; the device memory blocks its CUDA allocator asked the driver for, and how often it had to
    give back its cache and ask again (each time after waiting for the whole device). A new pinned block
    cost ~1 ms on an H200's host (docs/performance.md), one from the cache a few microseconds: a level of
    streams that makes many pays for them in its steps."""

    pinned_blocks_made: int = 0
    pinned_alloc_s: float = 0.0
    device_blocks_made: int = 0
    device_alloc_retries: int = 0


def engine_stats(batcher: BatcherStats, gates: GateCounts, memory: MemoryGrowth) -> dict:
    """All three, as one status message's ``stats``."""
    return {**asdict(batcher), **asdict(gates), **asdict(memory)}
