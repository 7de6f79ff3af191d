"""What the engine process reports of how its memory caches grew (worker.engine_process.main.memory_growth).
Not test_main.py: tests/cli has one, and test files need unique names."""

import pytest
import torch

from worker.engine_process.main import memory_growth
from worker.engine_report import MemoryGrowth

needs_a_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_on_a_cpu_no_memory_block_is_made():
    assert memory_growth(torch.device("cpu")) == MemoryGrowth()


def growth_around_a_new_block(**placement) -> tuple[torch.Tensor, MemoryGrowth, MemoryGrowth]:
    """A block larger than anything the test process holds (no cached block fits it), and what
    memory_growth said before and after it was made."""
    device = torch.device("cuda")
    before = memory_growth(device)
    held = torch.empty(3 * 2**28 + 12_345, dtype=torch.uint8, **placement)
    return held, before, memory_growth(device)


@needs_a_gpu
def test_on_a_gpu_a_pinned_block_of_a_new_size_is_counted_with_the_time_it_took():
    held, before, after = growth_around_a_new_block(pin_memory=True)
    assert held.is_pinned()
    assert after.pinned_blocks_made == before.pinned_blocks_made + 1
    assert after.pinned_alloc_s > before.pinned_alloc_s


@needs_a_gpu
def test_on_a_gpu_a_device_block_the_allocator_could_not_reuse_is_counted():
    held, before, after = growth_around_a_new_block(device=torch.device("cuda"))
    assert held.is_cuda
    assert after.device_blocks_made == before.device_blocks_made + 1
    assert after.device_alloc_retries == before.device_alloc_retries
