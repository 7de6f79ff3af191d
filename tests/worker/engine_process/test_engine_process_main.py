"""What the engine process reports of how its memory caches grew (worker.engine_process.main.memory_growth).
Not test_main.py: tests/cli has one, and test files need unique names."""

import json
import subprocess
import sys

import pytest
import torch

from worker.engine_process.main import memory_growth
from worker.engine_report import MemoryGrowth

needs_a_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_on_a_cpu_no_memory_block_is_made():
    assert memory_growth(torch.device("cpu")) == MemoryGrowth()


# A process of its own holds no cached pinned block that the new one could reuse. CUDA is initialised
# first, as the engine process's model has it: until then torch's statistics are empty dictionaries, and
# a pinned allocation does not initialise it (this test counted no block on an H100 without it).
PINNED_BLOCK_IN_A_FRESH_PROCESS = """
import json, sys, torch
from worker.engine_process.main import memory_growth
device = torch.device("cuda")
torch.cuda.init()
before = memory_growth(device)
held = torch.empty(2**20 + 12_345, dtype=torch.uint8, pin_memory=True)
after = memory_growth(device)
json.dump([held.is_pinned(), before.pinned_blocks_made, after.pinned_blocks_made,
           before.pinned_alloc_s, after.pinned_alloc_s], sys.stdout)
"""


@needs_a_gpu
def test_on_a_gpu_a_pinned_block_of_a_new_size_is_counted_with_the_time_it_took():
    run = subprocess.run(
        [sys.executable, "-c", PINNED_BLOCK_IN_A_FRESH_PROCESS], capture_output=True, text=True, check=True
    )
    pinned, blocks_before, blocks_after, seconds_before, seconds_after = json.loads(run.stdout)
    assert pinned
    assert blocks_after == blocks_before + 1
    assert seconds_after > seconds_before


@needs_a_gpu
def test_on_a_gpu_a_device_block_the_allocator_could_not_reuse_is_counted():
    # Larger than anything the test process holds: no cached block fits it.
    device = torch.device("cuda")
    torch.cuda.init()  # as above: no statistics before
    before = memory_growth(device)
    held = torch.empty(3 * 2**28 + 12_345, dtype=torch.uint8, device=device)
    after = memory_growth(device)
    assert held.is_cuda
    assert after.device_blocks_made == before.device_blocks_made + 1
    assert after.device_alloc_retries == before.device_alloc_retries
