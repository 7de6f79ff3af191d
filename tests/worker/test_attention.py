"""The slot attention kernel (worker.engine.attention) attends as masked SDPA does, reading only each slot's columns.

The kernel is Triton's; here it runs in Triton's interpreter on the CPU (there is no GPU here), which
executes the same program the GPU compiles. The interpreter is chosen when Triton is imported, so each
check runs in a fresh interpreter. The CUDA graph test in test_engine.py runs the kernel on a GPU.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def in_triton_interpreter(check: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-c", f"from tests.worker.test_attention import {check}; {check}()"],
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


def masked_reference(query, keys, values, lengths, scale):
    visible = (torch.arange(keys.shape[2]).unsqueeze(0) < lengths.unsqueeze(1))[:, None, None, :]
    return F.scaled_dot_product_attention(
        query, keys.float(), values.float(), attn_mask=visible, scale=scale, enable_gqa=True
    )


def check_each_slot_attends_over_its_own_filled_columns() -> None:
    from worker.engine.attention import decode_attention

    generator = torch.Generator().manual_seed(0)
    slots, heads, kv_heads, columns, dim = 5, 4, 2, 200, 16
    # One column, under one block, exactly one block, one more, and the whole cache.
    lengths = torch.tensor([1, 7, 64, 65, 200])
    for cache_dtype in (torch.float32, torch.float8_e4m3fn):
        query = torch.randn(slots, heads, 1, dim, generator=generator)
        keys = torch.randn(slots, kv_heads, columns, dim, generator=generator).to(cache_dtype)
        values = torch.randn(slots, kv_heads, columns, dim, generator=generator).to(cache_dtype)
        attended = decode_attention(query, keys, values, lengths, 0.25)
        expected = masked_reference(query, keys, values, lengths, 0.25)
        torch.testing.assert_close(attended, expected, atol=1e-5, rtol=1e-5)


def check_columns_past_a_slots_length_are_never_read() -> None:
    from worker.engine.attention import decode_attention

    query = torch.randn(2, 2, 1, 16)
    keys, values = torch.randn(2, 2, 128, 16), torch.randn(2, 2, 128, 16)
    lengths = torch.tensor([40, 100])
    before = decode_attention(query, keys, values, lengths, 0.25)
    keys[0, :, 40:], values[0, :, 40:] = float("nan"), float("nan")
    keys[1, :, 100:], values[1, :, 100:] = float("nan"), float("nan")
    assert torch.equal(decode_attention(query, keys, values, lengths, 0.25), before)


def test_each_slot_attends_over_its_own_filled_columns_in_the_model_dtype_and_fp8():
    in_triton_interpreter("check_each_slot_attends_over_its_own_filled_columns")


def test_columns_past_a_slots_length_are_never_read():
    in_triton_interpreter("check_columns_past_a_slots_length_are_never_read")
