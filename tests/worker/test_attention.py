"""The slot attention kernel (worker.engine.attention) attends as masked SDPA does, reading only each slot's columns.

The kernel is Triton's; here it runs in Triton's interpreter on the CPU (there is no GPU here), which
executes the same program the GPU compiles. The CUDA graph test in test_engine.py runs it on a GPU.
"""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from worker.engine import attention

    attention._kernel.cache_clear()
    yield attention.decode_attention
    attention._kernel.cache_clear()


def masked_reference(query, keys, values, lengths, scale):
    visible = (torch.arange(keys.shape[2]).unsqueeze(0) < lengths.unsqueeze(1))[:, None, None, :]
    return F.scaled_dot_product_attention(
        query, keys.float(), values.float(), attn_mask=visible, scale=scale, enable_gqa=True
    )


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_each_slot_attends_over_its_own_filled_columns(interpreted, cache_dtype):
    generator = torch.Generator().manual_seed(0)
    slots, heads, kv_heads, columns, dim = 5, 4, 2, 200, 16
    query = torch.randn(slots, heads, 1, dim, generator=generator)
    keys = torch.randn(slots, kv_heads, columns, dim, generator=generator).to(cache_dtype)
    values = torch.randn(slots, kv_heads, columns, dim, generator=generator).to(cache_dtype)
    # One column, under one block, exactly one block, one more, and the whole cache.
    lengths = torch.tensor([1, 7, 64, 65, 200])
    attended = interpreted(query, keys, values, lengths, 0.25)
    torch.testing.assert_close(attended, masked_reference(query, keys, values, lengths, 0.25), atol=1e-5, rtol=1e-5)


def test_columns_past_a_slots_length_are_never_read(interpreted):
    query = torch.randn(2, 2, 1, 16)
    keys, values = torch.randn(2, 2, 128, 16), torch.randn(2, 2, 128, 16)
    lengths = torch.tensor([40, 100])
    before = interpreted(query, keys, values, lengths, 0.25)
    keys[0, :, 40:], values[0, :, 40:] = float("nan"), float("nan")
    keys[1, :, 100:], values[1, :, 100:] = float("nan"), float("nan")
    assert torch.equal(interpreted(query, keys, values, lengths, 0.25), before)
