"""What the engine process reports of its pinned host memory (worker.engine_process.main.pinned_memory). Not
test_main.py: tests/cli has one, and test files need unique names."""

import pytest
import torch

from worker.engine_process.main import pinned_memory
from worker.engine_report import PinnedMemory


def test_on_a_cpu_no_pinned_memory_is_made():
    assert pinned_memory(torch.device("cpu")) == PinnedMemory()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_a_pinned_block_of_a_new_size_is_counted_with_the_time_it_took():
    device = torch.device("cuda")
    before = pinned_memory(device)
    # Larger than anything the test process has pinned: torch's cache has no block to hand out.
    held = torch.empty(3 * 2**28 + 12_345, dtype=torch.uint8, pin_memory=True)
    after = pinned_memory(device)
    assert held.is_pinned()
    assert after.pinned_blocks_made == before.pinned_blocks_made + 1
    assert after.pinned_alloc_s > before.pinned_alloc_s
