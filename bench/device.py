"""What every benchmark does with its device between timings: wait for it, give back what a finished
run held, and profile a piece of work's operations on it. Imported after ``worker.cuda.configure_allocator``
has run, like torch itself."""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


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


def operations_table(work: Callable[[], object], device: torch.device, rows: int, name_width: int) -> tuple[str, str]:
    """Run ``work`` under torch.profiler (the CPU's operations, and on a GPU their kernels) and return what its
    table is sorted by (the device's time on a GPU, the CPU's elsewhere) and the table of its ``rows``
    operations that took longest."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as recorded:
        work()
    sort_by = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    return sort_by, recorded.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=name_width)
