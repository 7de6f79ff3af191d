"""Where a benchmark's GPU memory went: runs another bench module with torch's allocator history on,
and when the GPU runs out of memory (before the stack unwinds and frees it) prints the live memory
grouped by the project's frames that allocated it, graph pools apart; at the end, the peak.

    python3 -m bench.memory_report bench.engine_phases --model synthetic-full --device cuda --jobs 1536

It found the vocoder's window graphs holding 20 GiB of autograd's saved activations (docs/performance.md,
eleventh session)."""

from __future__ import annotations

import collections
import runpy
import sys
from pathlib import Path

import torch

ROOT = str(Path(__file__).resolve().parent.parent)
HISTORY_ENTRIES = 200_000
FRAMES_SHOWN = 4
GROUPS_SHOWN = 25


def project_frames(frames: list[dict]) -> str:
    """The innermost project frames of an allocation's stack, as file:line:function < caller ..."""
    own = [frame for frame in frames if frame["filename"].startswith(ROOT)]
    return " < ".join(f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in own[:FRAMES_SHOWN]) or "?"


def live_memory() -> collections.Counter:
    """Bytes of live allocations by (graph pool or plain, the project frames that made them)."""
    groups = collections.Counter()
    for segment in torch.cuda.memory._snapshot()["segments"]:
        pool = "graph pool" if segment.get("segment_pool_id", (0, 0)) != (0, 0) else "plain"
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                groups[pool, project_frames(block.get("frames", []))] += block["size"]
    return groups


def report_out_of_memory(device: int, asked: int, device_allocated: int, device_free: int) -> None:
    print(f"out of memory: asked {asked / 2**30:.2f} GiB with {device_free / 2**30:.2f} GiB free; live:", flush=True)
    for (pool, frames), size in live_memory().most_common(GROUPS_SHOWN):
        print(f"{size / 2**30:8.2f} GiB {pool:10} {frames}", flush=True)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python3 -m bench.memory_report BENCH_MODULE [its arguments]")
    if not torch.cuda.is_available():
        sys.exit("bench.memory_report reads the CUDA allocator's history: it needs a GPU")
    torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
    torch._C._cuda_attach_out_of_memory_observer(report_out_of_memory)
    module = sys.argv[1]
    sys.argv = sys.argv[1:]
    try:
        runpy.run_module(module, run_name="__main__")
    finally:
        print(f"peak allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
