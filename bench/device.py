"""What every benchmark does with its device between timings: wait for it, and give back what a finished
run held. Imported after ``worker.cuda.configure_allocator`` has run, like torch itself."""

from __future__ import annotations

import gc

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    """Collect what the caller dropped (graphs and runners hold cycles) and return the allocator's cached
    blocks, so that the next run, or another process on the same GPU, starts with the memory free."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
