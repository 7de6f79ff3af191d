"""Decode attention over a slot cache that reads each slot's own filled columns, and no more.

A decode step's query is one position per slot; slots are at different depths. Attention with a
mask over a common width (what ``scaled_dot_product_attention`` takes) reads every slot's cache up to
the deepest slot's, and on a GPU a decode step is bound by those reads. These Triton kernels read what
the slots hold, at the bandwidth of the GPU, in two stages (split-KV, as flash-decoding does):

1. one program per (slot, head, split of :data:`SPLIT_COLUMNS` columns) streams its part of the
   slot's keys and values with an online softmax and leaves a partial result (its weighted sum, its
   largest score and its sum of weights); a slot's splits past its length end at once. So a single
   slot with a long context still spreads over many of the GPU's cores, and a step of many slots
   has programs enough without;
2. one program per (slot, head) merges the slot's partial results.

The step's new key and value come in as tensors, not from the cache: the program whose split holds
the new column writes them to the cache (in its dtype, fp8 included) and attends to them as written,
so a step needs no kernel of its own for the cache write. Every bound is read on the device, so one
CUDA graph per row count serves every depth. The one entry point is :func:`decode_attention`, so that
another backend (FlashInfer's decode kernels, say) can take its place. Used on CUDA when Triton is
present; elsewhere the runner attends with a mask (and Triton's interpreter runs these kernels on the
CPU for the tests).
"""

from __future__ import annotations

import functools

import torch

# Columns a program reads per split, and per iteration (a divisor of it), warps and pipeline stages,
# by the cache's bytes a value (an fp8 cache reads more columns an iteration). Chosen by a sweep of
# 2 splits x 3 blocks x 2 warp counts x 3 stage counts on an H200 at 1,024 rows of the standard
# workload's contexts (docs/performance.md): bf16 334 us a layer (2,919 GB/s), fp8 228 us.
SPLIT_COLUMNS = 512
_LAUNCH = {2: {"BLOCK": 64, "num_warps": 4, "num_stages": 4}, 1: {"BLOCK": 256, "num_warps": 4, "num_stages": 2}}


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def splits_for(context: int) -> int:
    """How many splits cover ``context`` columns of a slot's cache."""
    return -(-context // SPLIT_COLUMNS)


def decode_attention(
    query: torch.Tensor,
    new_key: torch.Tensor,
    new_value: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    columns: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Write each row's new key and value at its column of the cache, then attend its query over the
    cache's columns up to and including that one.

    ``query`` is (rows, heads, 1, dim); ``new_key`` and ``new_value`` (rows, kv heads, 1, dim), in the
    query's dtype; ``keys`` and ``values`` (rows, kv heads, context, dim) views of the cache (any float
    dtype, fp8 included, with unit stride along dim); heads share kv heads in groups; ``columns``
    (rows,) the column each row's new position goes to, or -1 for a row that takes no part (a slot
    that finished or holds nothing: nothing of its cache is read or written, and its output is
    zeros). Returns (rows, heads, 1, dim) in the query's dtype.
    """
    rows, heads, _, dim = query.shape
    kv_heads, context = keys.shape[1], keys.shape[2]
    splits = splits_for(context)
    partial = torch.empty((rows, heads, splits, dim), dtype=torch.float32, device=query.device)
    best_scores = torch.empty((rows, heads, splits), dtype=torch.float32, device=query.device)
    weight_sums = torch.empty_like(best_scores)
    out = torch.empty_like(query)
    launch = _LAUNCH[min(keys.element_size(), 2)]
    attend, merge = _kernels()
    attend[(rows, heads, splits)](
        query,
        new_key,
        new_value,
        keys,
        values,
        columns,
        partial,
        best_scores,
        weight_sums,
        scale,
        query.stride(0),
        query.stride(1),
        new_key.stride(0),
        new_key.stride(1),
        new_value.stride(0),
        new_value.stride(1),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        values.stride(0),
        values.stride(1),
        values.stride(2),
        GROUP=heads // kv_heads,
        DIM=dim,
        SPLIT=SPLIT_COLUMNS,
        SPLITS=splits,
        **launch,
    )
    merge[(rows, heads)](
        partial,
        best_scores,
        weight_sums,
        columns,
        out,
        out.stride(0),
        out.stride(1),
        DIM=dim,
        SPLIT=SPLIT_COLUMNS,
        SPLITS=splits,
        SPLITS_POWER=max(2, 1 << (splits - 1).bit_length()),
        num_warps=2,
    )
    return out


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def attend_split(
        query,
        new_key,
        new_value,
        keys,
        values,
        columns,
        partial,
        best_scores,
        weight_sums,
        scale,
        query_row,
        query_head,
        new_key_row,
        new_key_head,
        new_value_row,
        new_value_head,
        key_row,
        key_head,
        key_column,
        value_row,
        value_head,
        value_column,
        GROUP: tl.constexpr,
        DIM: tl.constexpr,
        BLOCK: tl.constexpr,
        SPLIT: tl.constexpr,
        SPLITS: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)
        split = tl.program_id(2)
        kv_head = head // GROUP
        new_column = tl.load(columns + row)
        start = split * SPLIT
        if start > new_column:  # past the row's length (or a row taking no part): the merge reads nothing here
            return
        dims = tl.arange(0, DIM)
        q = tl.load(query + row * query_row + head * query_head + dims).to(tl.float32) * scale
        key_base = keys + row * key_row + kv_head * key_head
        value_base = values + row * value_row + kv_head * value_head
        best = tl.full((), float("-inf"), tl.float32)
        total = tl.full((), 0.0, tl.float32)
        acc = tl.zeros((DIM,), tl.float32)
        # The cache's columns before the new one, in this split.
        end = tl.minimum(start + SPLIT, new_column)
        for block_start in range(start, end, BLOCK):
            offsets = block_start + tl.arange(0, BLOCK)
            inside = offsets < end
            k = tl.load(key_base + offsets[:, None] * key_column + dims[None, :], mask=inside[:, None], other=0.0)
            scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
            scores = tl.where(inside, scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=0))
            weights = tl.exp(scores - new_best)
            rescale = tl.exp(best - new_best)
            v = tl.load(value_base + offsets[:, None] * value_column + dims[None, :], mask=inside[:, None], other=0.0)
            acc = acc * rescale + tl.sum(weights[:, None] * v.to(tl.float32), axis=0)
            total = total * rescale + tl.sum(weights, axis=0)
            best = new_best
        if new_column < start + SPLIT:  # the new column is this split's: write it, and attend to it as written
            k_new = tl.load(new_key + row * new_key_row + kv_head * new_key_head + dims)
            v_new = tl.load(new_value + row * new_value_row + kv_head * new_value_head + dims)
            k_new = k_new.to(keys.dtype.element_ty)
            v_new = v_new.to(values.dtype.element_ty)
            if head % GROUP == 0:
                tl.store(key_base + new_column * key_column + dims, k_new)
                tl.store(value_base + new_column * value_column + dims, v_new)
            score = tl.sum(k_new.to(tl.float32) * q, axis=0)
            new_best = tl.maximum(best, score)
            weight = tl.exp(score - new_best)
            rescale = tl.exp(best - new_best)
            acc = acc * rescale + weight * v_new.to(tl.float32)
            total = total * rescale + weight
            best = new_best
        at = (row * tl.num_programs(1) + head) * SPLITS + split
        tl.store(partial + at * DIM + dims, acc)
        tl.store(best_scores + at, best)
        tl.store(weight_sums + at, total)

    @triton.jit
    def merge_splits(
        partial,
        best_scores,
        weight_sums,
        columns,
        out,
        out_row,
        out_head,
        DIM: tl.constexpr,
        SPLIT: tl.constexpr,
        SPLITS: tl.constexpr,
        SPLITS_POWER: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)
        dims = tl.arange(0, DIM)
        new_column = tl.load(columns + row)
        if new_column < 0:
            tl.store(out + row * out_row + head * out_head + dims, tl.zeros((DIM,), out.dtype.element_ty))
            return
        used = new_column // SPLIT + 1
        splits = tl.arange(0, SPLITS_POWER)
        taken = splits < used
        at = (row * tl.num_programs(1) + head) * SPLITS
        best = tl.load(best_scores + at + splits, mask=taken, other=float("-inf"))
        total = tl.load(weight_sums + at + splits, mask=taken, other=0.0)
        overall = tl.max(best, axis=0)
        factors = tl.where(taken, tl.exp(best - overall), 0.0)
        acc = tl.load(partial + (at + splits[:, None]) * DIM + dims[None, :], mask=taken[:, None], other=0.0)
        merged = tl.sum(acc * factors[:, None], axis=0) / tl.sum(total * factors, axis=0)
        tl.store(out + row * out_row + head * out_head + dims, merged.to(out.dtype.element_ty))

    return attend_split, merge_splits
