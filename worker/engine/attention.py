"""Decode attention over a slot cache that reads each slot's own filled columns, and no more.

A decode step's query is one position per slot; slots are at different depths. Attention with a
mask over a common width (what ``scaled_dot_product_attention`` takes) reads every slot's cache up to
the deepest slot's, and on a GPU a decode step is bound by those reads: at 512 slots, each extra
512 columns of width cost ~9 ms on an H200. This Triton kernel runs one program per (slot, head),
which streams that slot's keys and values up to its own length with an online softmax, so a step
reads what the slots hold. The loop bound is read on the device, so one CUDA graph serves every
depth. Used on CUDA when Triton is present; elsewhere the runner attends with a mask.
"""

from __future__ import annotations

import functools

import torch

BLOCK_COLUMNS = 64


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def decode_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of ``query`` (rows, heads, 1, dim) over the first ``lengths[row]`` columns of its cache.

    ``keys`` and ``values`` are (rows, kv heads, columns, dim) views of the cache (any float dtype,
    fp8 included); heads share kv heads in groups. Returns (rows, heads, 1, dim) in the query's dtype.
    """
    rows, heads, _, dim = query.shape
    out = torch.empty_like(query)
    _kernel()[(rows, heads)](
        query,
        keys,
        values,
        out,
        lengths,
        scale,
        query.stride(0),
        query.stride(1),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        values.stride(0),
        values.stride(1),
        values.stride(2),
        out.stride(0),
        out.stride(1),
        GROUP=heads // keys.shape[1],
        DIM=dim,
        BLOCK=BLOCK_COLUMNS,
    )
    return out


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def attend(
        query,
        keys,
        values,
        out,
        lengths,
        scale,
        query_row,
        query_head,
        key_row,
        key_head,
        key_column,
        value_row,
        value_head,
        value_column,
        out_row,
        out_head,
        GROUP: tl.constexpr,
        DIM: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP
        length = tl.load(lengths + row)
        dims = tl.arange(0, DIM)
        q = tl.load(query + row * query_row + head * query_head + dims).to(tl.float32) * scale
        key_base = keys + row * key_row + kv_head * key_head
        value_base = values + row * value_row + kv_head * value_head
        best = tl.full((), float("-inf"), tl.float32)
        total = tl.full((), 0.0, tl.float32)
        acc = tl.zeros((DIM,), tl.float32)
        for start in range(0, length, BLOCK):
            columns = start + tl.arange(0, BLOCK)
            inside = columns < length
            k = tl.load(key_base + columns[:, None] * key_column + dims[None, :], mask=inside[:, None], other=0.0)
            scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
            scores = tl.where(inside, scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=0))
            weights = tl.exp(scores - new_best)
            rescale = tl.exp(best - new_best)
            v = tl.load(value_base + columns[:, None] * value_column + dims[None, :], mask=inside[:, None], other=0.0)
            acc = acc * rescale + tl.sum(weights[:, None] * v.to(tl.float32), axis=0)
            total = total * rescale + tl.sum(weights, axis=0)
            best = new_best
        tl.store(out + row * out_row + head * out_head + dims, (acc / total).to(out.dtype.element_ty))

    return attend
