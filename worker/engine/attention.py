"""Attention over a paged KV cache that reads what each slot holds, and no more: the decode step's, and
the prefill's over its prompts packed into one sequence.

A decode step's query is one position per slot; slots are at different depths, and each slot's
positions live in the blocks of its block table (worker.engine.blocks), scattered over one pool.
Attention with a mask over a common width (what ``scaled_dot_product_attention`` takes) reads every
slot's cache up to the deepest slot's, and on a GPU a decode step is bound by those reads. These
Triton kernels read what the slots hold, at the bandwidth of the GPU, in two stages (split-KV, as
flash-decoding does):

1. programs for each (slot, head) stream the slot's keys and values a split of positions at a time,
   block by block through the slot's table, with an online softmax, and leave each split's partial
   result (its weighted sum, its largest score and its sum of weights). A (slot, head) has as many
   programs as keep the GPU's cores busy (:func:`split_programs_for`), each taking every n-th split
   of the n up to the slot's length: a single slot with a long context spreads over many cores, and
   a step of many slots has programs enough with one each (where a program per split, mostly past
   their slots' lengths, would cost their launches for nothing: the grid is the same for every depth,
   so that one CUDA graph per row count serves them all). A step of few slots cuts them into short
   splits (:func:`split_columns_for`), so that a slot's context spreads over its programs however
   short it is;
2. one program per (slot, head) merges the slot's partial results, when it has more than one (a
   slot whose positions fit one split has its result written by that split's program). A step of
   slots enough for a program each makes a slot's whole table one split (:func:`split_columns_for`):
   its program writes the result, and the merge is not launched.

The step's new key and value come in as tensors, not from the cache: the program whose split holds
the new column writes them to the cache (in its dtype, fp8 included) and attends to them as written,
so a step needs no kernel of its own for the cache write. Given the rotary's table, the kernel also
rotates the query and the new key to the row's position as it loads them, so that the layer's matmul
hands them over unrotated and the rotary needs no kernel of its own either. Every bound is read on the
device. The one entry point is :func:`decode_attention`, so that another backend (FlashInfer's decode
kernels, say) can take its place. Used on CUDA when Triton is present; elsewhere the runner attends with a mask
(and Triton's interpreter runs these kernels on the CPU for the tests).

A prefill pass runs the prompts admitted together as one sequence, one after another with no padding
between them (varlen, as flash attention calls it): each token attends to its own prompt's tokens up to
itself, and to nothing of the other prompts. :func:`prefill_attention` takes the pass's own keys and
values (the runner writes them to the cache beside it) and, per token, where its prompt starts in the
pass. On CUDA a Triton kernel runs it, a program per tile of queries and head over the keys from the
tile's first prompt's start (a tile may span prompts: each query masks what is not its own), with
the products on the tensor cores; elsewhere (and as the kernel's reference) masked
``scaled_dot_product_attention`` over windows of the pass.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

# Positions a program reads per iteration (its tile: whole blocks of the cache), warps and pipeline
# stages, and whether its products run on the tensor cores, by the cache's bytes a value. Chosen by
# sweeps of tiles, warp counts and stage counts, each way of multiplying, on an H200 at the standard
# workload's full load (1,536 slots, mean context 341, their blocks scattered over the pool as the
# engine left them; splits of 512 positions then; docs/performance.md): bf16 on the CUDA cores with
# tiles of 64 and 2 warps 419 us a layer (3,835 GB/s; on the tensor cores 436 us); fp8 with tiles of
# 64 and 1 warp 229 us (3,514 GB/s; tiles of 128 and 2 warps 269 us; on the tensor cores, widened to
# float16, 379 us and more). Fewer warps, more programs resident on each multiprocessor: more loads in
# flight.
#
# HALF_PRODUCTS: an fp8 tile's products and their sums within a thread in float16 pairs (a key's fp8
# values are exact in float16, and one instruction multiplies or adds two), rather than each value widened
# to float32 apart. Compiled offline for sm_90a, the fp8 launch's loop ran 1,178 instructions a tile of
# 256 values a thread (4.6 a value, at 1 byte a value near what a multiprocessor issues while its share
# of the bandwidth streams in); in float16 pairs 948, with positions in int32 910, and with scores in
# base 2 871 (3.4). A score sums 16 products in float16 (|q| x |k| up to a few thousand stay far inside
# its range) and those sums in float32; a value's weighted sum is bounded by 64 x 448, the largest fp8
# value, since every weight is at most 1.
_LAUNCH = {
    2: {"TILE": 64, "num_warps": 2, "num_stages": 2, "TENSOR_CORES": False, "HALF_PRODUCTS": False},
    1: {"TILE": 64, "num_warps": 1, "num_stages": 2, "TENSOR_CORES": False, "HALF_PRODUCTS": True},
}
# The splits of a step of few slots: one tile each.
SHORT_SPLIT_COLUMNS = 64


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# Programs a step's attention launches at least, where its slots have splits enough: a few per
# streaming multiprocessor of an H200 (132 of them).
BUSY_PROGRAMS = 1024


def splits_for(context: int, split_columns: int) -> int:
    """How many splits of ``split_columns`` cover ``context`` columns of a slot's cache."""
    return -(-context // split_columns)


def split_columns_for(rows: int, heads: int, context: int) -> int:
    """How many positions a split holds in a step of ``rows`` slots whose tables cover ``context``
    positions: the whole table where the slots and heads keep the GPU busy with a program each (that
    program would take every split of its slot in turn: one split, and no merge to launch, does the
    same reads; at 1,536 slots the merge was 3% of a step's kernels on an H200), one tile's where they
    are too few. A slot's programs take its splits up to its length, and with splits of 512 one slot at
    the standard workload's contexts (~370) had one split: one program read it a tile at a time while
    the others sat idle, 11.3 us a layer on an H200 (26% of the one-job step's kernels); in splits of
    64 over 69 programs, 6.4, and one job alone went from 17.7 to 25.4 audio-s/s with the compiled draw
    (docs/performance.md)."""
    return context if rows * heads >= BUSY_PROGRAMS else SHORT_SPLIT_COLUMNS


def split_programs_for(rows: int, heads: int, splits: int) -> int:
    """How many programs share each (slot, head)'s splits: one each, or more when the slots and heads
    alone are too few programs to keep the GPU busy (one slot: a program per split). At 2,048 slots
    and the 9 splits of a clip voice's context, a program per split took the step from 5.95 to 7.13 ms
    on an H200, nearly every one of them past its slot's length."""
    return max(1, min(splits, -(-BUSY_PROGRAMS // (rows * heads))))


def decode_attention(
    query: torch.Tensor,
    new_key: torch.Tensor,
    new_value: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    block_table: torch.Tensor,
    columns: torch.Tensor,
    scale: float,
    split_programs: int | None = None,
    split_columns: int | None = None,
    rotary: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write each row's new key and value at its position of the cache, then attend its query over
    its positions up to and including that one.

    ``query`` is (rows, heads, 1, dim); ``new_key`` and ``new_value`` (rows, kv heads, 1, dim), in the
    query's dtype; ``keys`` and ``values`` (blocks, kv heads, block positions, dim), the cache's pool
    of one layer (any float dtype, fp8 included, with unit stride along dim); heads share kv heads in
    groups; ``block_table`` (rows, table width) the blocks holding each row's positions in order;
    ``columns`` (rows,) the position each row's new key and value go to, or -1 for a row that takes
    no part (a slot that finished or holds nothing: nothing of its cache is read or written, and its
    output is zeros); ``split_columns``, the positions of a split (by default :func:`split_columns_for`;
    rounded up to a multiple of the launch's tile); ``split_programs``, the programs each (row, head)
    takes (by default :func:`split_programs_for`); ``rotary``, (2, columns, dim) the cos and sin of
    every position (the runner's table): given, the query and the new key come unrotated, and are
    rotated to their row's position as transformers' Llama rotates them (``x * cos + rotate_half(x) *
    sin``), in float32 and rounded once to the query's dtype, as the compiled layer rounded them.
    Returns (rows, heads, 1, dim) in the query's dtype.
    """
    rows, heads, _, dim = query.shape
    kv_heads, block_positions = keys.shape[1], keys.shape[2]
    context = block_table.shape[1] * block_positions
    if rotary is not None and (rotary.shape[0] != 2 or rotary.shape[2] != dim or rotary.stride()[1:] != (dim, 1)):
        raise ValueError(f"the rotary's table must be (2, columns, {dim}), a row after the other: {rotary.shape}")
    launch = _LAUNCH[min(keys.element_size(), 2)]
    split_columns = split_columns or split_columns_for(rows, heads, context)
    launch = {**launch, "TILE": min(launch["TILE"], split_columns)}
    split_columns = -(-split_columns // launch["TILE"]) * launch["TILE"]
    splits = splits_for(context, split_columns)
    partial = torch.empty((rows, heads, splits, dim), dtype=torch.float32, device=query.device)
    best_scores = torch.empty((rows, heads, splits), dtype=torch.float32, device=query.device)
    weight_sums = torch.empty_like(best_scores)
    out = torch.empty_like(query)
    attend, merge = _kernels()
    split_programs = split_programs or split_programs_for(rows, heads, splits)
    attend[(rows, heads, split_programs)](
        query,
        new_key,
        new_value,
        keys,
        values,
        block_table,
        columns,
        query if rotary is None else rotary,
        0 if rotary is None else rotary.stride(0),
        partial,
        best_scores,
        weight_sums,
        out,
        # Scores in base 2 (the query scaled by log2(e) too): exp2 is one instruction, exp is two and a fix-up.
        scale * math.log2(math.e),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
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
        BLOCK_POSITIONS=block_positions,
        SPLIT=split_columns,
        SPLITS=splits,
        OPERAND=_operand_type(keys.dtype),
        ROTATE=rotary is not None,
        **launch,
    )
    if splits == 1:  # every row's result written by its one split's program
        return out
    merge[(rows, heads)](
        partial,
        best_scores,
        weight_sums,
        columns,
        out,
        out.stride(0),
        out.stride(1),
        DIM=dim,
        SPLIT=split_columns,
        SPLITS=splits,
        SPLITS_POWER=max(2, 1 << (splits - 1).bit_length()),
        # Short splits leave up to ~70 partial results a (row, head) to merge: more threads to hold them.
        num_warps=2 if splits <= 16 else 4,
    )
    return out


# A prefill program's tile: queries (one program's), keys (an iteration's), warps and stages. Not swept: at
# the standard workload's prompts (~165 tokens) a pass's attention is a few percent of its arithmetic (a
# token's scores and weighted sum over the ~82 tokens before it, 2 x 82 x 768 multiply-adds a layer, up to
# twice that with what its tile masks, against ~9.4M in the layer's matmuls). A tile of 64 queries spans a
# few prompts at most, so little of its work goes to keys that its queries mask.
_PREFILL_LAUNCH = {"QUERIES": 64, "KEYS": 64, "num_warps": 4, "num_stages": 2}
# The queries the reference attends at once: its scores take heads x this x (this + longest) floats.
REFERENCE_QUERIES = 256


def prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
    longest: int,
    *,
    kernel: bool | None = None,
) -> torch.Tensor:
    """Attend each token of a pass's packed prompts over its own prompt's tokens up to and including itself.

    ``query`` is (heads, tokens, dim); ``key`` and ``value`` (kv heads, tokens, dim), in the query's dtype,
    with unit stride along dim; heads share kv heads in groups; ``starts`` (tokens,) where each token's
    prompt starts in the pass (the prompts lie one after another, so ``starts`` never decreases; a token
    that is its own start attends to itself alone, as the runner's padding does); ``longest``, the most
    tokens a prompt of the pass has: the reference reads each query's keys that far back, no further;
    ``kernel``, whether Triton's kernel runs it (by default where the query is on CUDA and Triton is
    present), or the reference.
    Returns (heads, tokens, dim) in the query's dtype, laid out as (tokens, heads, dim): the layer's output
    projection reads each token's heads together.
    """
    heads, tokens, dim = query.shape
    out = query.new_empty(tokens, heads, dim).transpose(0, 1)
    if kernel is None:
        kernel = query.device.type == "cuda" and triton_available()
    if not kernel:
        _masked_windows(query, key, value, starts, scale, longest, out)
        return out
    launch = _PREFILL_LAUNCH
    _prefill_kernel()[(-(-tokens // launch["QUERIES"]), heads)](
        query,
        key,
        value,
        starts,
        out,
        # The kernel's exponentials are powers of two, faster than e's on the GPU.
        scale * math.log2(math.e),
        tokens,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        out.stride(0),
        out.stride(1),
        GROUP=heads // key.shape[0],
        DIM=dim,
        # float32's products in full precision (tf32 would miss the model's own by ~1e-3); the others'
        # operands are exact on the tensor cores as they are.
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        **launch,
    )
    return out


def _masked_windows(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
    longest: int,
    out: torch.Tensor,
) -> None:
    """:func:`prefill_attention` by ``scaled_dot_product_attention``, written to ``out``: REFERENCE_QUERIES
    queries at a time over the keys as far back as their prompts may start, with a mask of each query's
    own prompt up to itself. A mask over the whole pass would take tokens x tokens of memory (tens of GiB
    at a CPU worker's budget); these windows take no more than their queries' prompts need, and their
    bounds are known before the pass runs, so that a CUDA graph can hold them."""
    heads, tokens, _ = query.shape
    index = torch.arange(tokens, device=query.device)
    for first in range(0, tokens, REFERENCE_QUERIES):
        stop = min(first + REFERENCE_QUERIES, tokens)
        window = max(0, first - longest + 1)
        columns = index[window:stop]
        visible = (columns >= starts[first:stop, None]) & (columns <= index[first:stop, None])
        out[:, first:stop] = F.scaled_dot_product_attention(
            query[None, :, first:stop],
            key[None, :, window:stop],
            value[None, :, window:stop],
            attn_mask=visible,
            scale=scale,
            enable_gqa=heads != key.shape[0],
        )[0]


def _operand_type(cache_dtype: torch.dtype):
    """What the tensor cores multiply a tile in: fp8 widens to float16 (exactly, in one instruction for two
    values, and float16 keeps more of the weights than bfloat16); other dtypes stay as they are."""
    import triton.language as tl

    if cache_dtype.itemsize == 1:
        return tl.float16
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[cache_dtype]


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
        block_table,
        columns,
        rotary,
        rotary_sin,
        partial,
        best_scores,
        weight_sums,
        out,
        scale,
        table_row,
        out_row,
        out_head,
        query_row,
        query_head,
        new_key_row,
        new_key_head,
        new_value_row,
        new_value_head,
        key_block,
        key_head,
        key_column,
        value_block,
        value_head,
        value_column,
        GROUP: tl.constexpr,
        DIM: tl.constexpr,
        BLOCK_POSITIONS: tl.constexpr,
        TILE: tl.constexpr,
        SPLIT: tl.constexpr,
        SPLITS: tl.constexpr,
        OPERAND: tl.constexpr,
        TENSOR_CORES: tl.constexpr,
        HALF_PRODUCTS: tl.constexpr,
        ROTATE: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)
        first_split = tl.program_id(2)
        kv_head = head // GROUP
        # int32: a row's positions fit, and 64-bit index arithmetic was a twentieth of the loop.
        new_column = tl.load(columns + row).to(tl.int32)
        dims = tl.arange(0, DIM)
        if new_column < 0:  # a row taking no part: zeros, written here when there is no merge to write them
            if SPLITS == 1:
                tl.store(out + row * out_row + head * out_head + dims, tl.zeros((DIM,), out.dtype.element_ty))
            return
        q_at = query + row * query_row + head * query_head
        k_at = new_key + row * new_key_row + kv_head * new_key_head
        if ROTATE:
            # The query and the new key as the two rows of one tile, rotated as transformers' Llama rotates
            # a head: x * cos + rotate_half(x) * sin, rotate_half(x) being (-second half, first half); in
            # float32, each rounded once to its dtype.
            pair = tl.arange(0, 2)[:, None]
            pair_at = tl.where(pair == 0, q_at, k_at)
            half = tl.load(pair_at + ((dims + DIM // 2) % DIM)[None, :]).to(tl.float32)
            half = tl.where(dims[None, :] < DIM // 2, -half, half)
            cos = tl.load(rotary + new_column * DIM + dims).to(tl.float32)
            sin = tl.load(rotary + rotary_sin + new_column * DIM + dims).to(tl.float32)
            turned = tl.load(pair_at + dims[None, :]).to(tl.float32) * cos[None, :] + half * sin[None, :]
            q = tl.sum(tl.where(pair == 0, turned, 0.0), axis=0).to(query.dtype.element_ty)
            k_turned = tl.sum(tl.where(pair == 1, turned, 0.0), axis=0).to(new_key.dtype.element_ty)
        else:
            q = tl.load(q_at + dims)
        q = q.to(tl.float32) * scale
        table = block_table + row * table_row
        key_base = keys + kv_head * key_head
        value_base = values + kv_head * value_head
        # On the tensor cores a query is a matrix of 16 columns, all zero but the first (a product needs
        # 16 at least), and so are the weights that multiply the values: what comes out is exact.
        lanes = tl.arange(0, 16)[None, :] == 0
        query_lanes = tl.where(lanes, q[:, None], 0.0).to(OPERAND)
        q_half = q.to(tl.float16)
        # This program's splits: every n-th of the n sharing the row's head, up to the split holding
        # the new column.
        for split in range(first_split, new_column // SPLIT + 1, tl.num_programs(2)):
            start = split * SPLIT
            best = tl.full((), float("-inf"), tl.float32)
            total = tl.full((), 0.0, tl.float32)
            acc = tl.zeros((DIM,), tl.float32)
            acc_lanes = tl.zeros((DIM, 16), tl.float32)
            # The row's positions before the new one, in this split, a tile at a time (a tile spans one
            # block or several whole ones).
            end = tl.minimum(start + SPLIT, new_column)
            for tile_start in range(start, end, TILE):
                offsets = tile_start + tl.arange(0, TILE)
                inside = offsets < end
                blocks = tl.load(table + offsets // BLOCK_POSITIONS, mask=inside, other=0)
                # Keys and values loaded together: twice the bytes in flight while the products wait.
                places = blocks * key_block + (offsets % BLOCK_POSITIONS) * key_column
                k = tl.load(key_base + places[:, None] + dims[None, :], mask=inside[:, None], other=0.0)
                places = blocks * value_block + (offsets % BLOCK_POSITIONS) * value_column
                v = tl.load(value_base + places[:, None] + dims[None, :], mask=inside[:, None], other=0.0)
                if TENSOR_CORES:
                    scores = tl.sum(tl.dot(k.to(OPERAND), query_lanes), axis=1)
                elif HALF_PRODUCTS:
                    products = tl.reshape(k.to(tl.float16) * q_half[None, :], (TILE, 4, DIM // 4))
                    scores = tl.sum(tl.sum(products, axis=2).to(tl.float32), axis=1)
                else:
                    scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
                scores = tl.where(inside, scores, float("-inf"))
                new_best = tl.maximum(best, tl.max(scores, axis=0))
                weights = tl.math.exp2(scores - new_best)
                rescale = tl.math.exp2(best - new_best)
                if TENSOR_CORES:
                    weight_lanes = tl.where(lanes, weights[:, None], 0.0).to(OPERAND)
                    acc_lanes = acc_lanes * rescale + tl.dot(tl.trans(v.to(OPERAND)), weight_lanes)
                elif HALF_PRODUCTS:
                    products = weights.to(tl.float16)[:, None] * v.to(tl.float16)
                    acc = acc * rescale + tl.sum(products, axis=0).to(tl.float32)
                else:
                    acc = acc * rescale + tl.sum(weights[:, None] * v.to(tl.float32), axis=0)
                total = total * rescale + tl.sum(weights, axis=0)
                best = new_best
            if TENSOR_CORES:
                acc = tl.sum(acc_lanes, axis=1)
            if new_column < start + SPLIT:  # the new position is this split's: write it, and attend to it as written
                k_new = k_turned if ROTATE else tl.load(k_at + dims)
                v_new = tl.load(new_value + row * new_value_row + kv_head * new_value_head + dims)
                k_new = k_new.to(keys.dtype.element_ty)
                v_new = v_new.to(values.dtype.element_ty)
                if head % GROUP == 0:
                    block = tl.load(table + new_column // BLOCK_POSITIONS)
                    offset = new_column % BLOCK_POSITIONS
                    tl.store(key_base + block * key_block + offset * key_column + dims, k_new)
                    tl.store(value_base + block * value_block + offset * value_column + dims, v_new)
                score = tl.sum(k_new.to(tl.float32) * q, axis=0)
                new_best = tl.maximum(best, score)
                weight = tl.math.exp2(score - new_best)
                rescale = tl.math.exp2(best - new_best)
                acc = acc * rescale + weight * v_new.to(tl.float32)
                total = total * rescale + weight
                best = new_best
            if new_column < SPLIT:  # the row's only split: its result is the answer, with nothing to merge
                tl.store(out + row * out_row + head * out_head + dims, (acc / total).to(out.dtype.element_ty))
            else:
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
        if new_column < SPLIT:  # one split, whose program wrote the result
            return
        used = new_column // SPLIT + 1
        splits = tl.arange(0, SPLITS_POWER)
        taken = splits < used
        at = (row * tl.num_programs(1) + head) * SPLITS
        best = tl.load(best_scores + at + splits, mask=taken, other=float("-inf"))
        total = tl.load(weight_sums + at + splits, mask=taken, other=0.0)
        overall = tl.max(best, axis=0)
        factors = tl.where(taken, tl.math.exp2(best - overall), 0.0)
        acc = tl.load(partial + (at + splits[:, None]) * DIM + dims[None, :], mask=taken[:, None], other=0.0)
        merged = tl.sum(acc * factors[:, None], axis=0) / tl.sum(total * factors, axis=0)
        tl.store(out + row * out_row + head * out_head + dims, merged.to(out.dtype.element_ty))

    return attend_split, merge_splits


@functools.cache
def _prefill_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def attend_packed(
        query,
        key,
        value,
        starts,
        out,
        scale_log2,
        tokens,
        query_head,
        query_token,
        key_head,
        key_token,
        value_head,
        value_token,
        out_head,
        out_token,
        GROUP: tl.constexpr,
        DIM: tl.constexpr,
        PRECISION: tl.constexpr,
        QUERIES: tl.constexpr,
        KEYS: tl.constexpr,
    ):
        first_query = tl.program_id(0) * QUERIES
        head = tl.program_id(1)
        kv_head = head // GROUP
        rows = first_query + tl.arange(0, QUERIES)
        inside = rows < tokens
        dims = tl.arange(0, DIM)
        q = tl.load(
            query + head * query_head + rows[:, None] * query_token + dims[None, :], mask=inside[:, None], other=0.0
        )
        # A query past the pass starts past it too: it sees none of the pass's keys (and is never stored).
        row_starts = tl.load(starts + rows, mask=inside, other=tokens)
        key_base = key + kv_head * key_head
        value_base = value + kv_head * value_head
        # Finite, so that a query none of whose keys a tile holds yet rescales by exp2(0), not by NaN.
        best = tl.full((QUERIES,), -1.0e30, tl.float32)
        total = tl.zeros((QUERIES,), tl.float32)
        acc = tl.zeros((QUERIES, DIM), tl.float32)
        # From the tile's first query's prompt's start (the earliest any of its queries reads: the starts
        # never decrease) to its last query.
        for first_key in range(tl.load(starts + first_query), tl.minimum(first_query + QUERIES, tokens), KEYS):
            columns = first_key + tl.arange(0, KEYS)
            held = (columns < tokens)[:, None]
            k = tl.load(key_base + columns[:, None] * key_token + dims[None, :], mask=held, other=0.0)
            v = tl.load(value_base + columns[:, None] * value_token + dims[None, :], mask=held, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
            visible = (columns[None, :] >= row_starts[:, None]) & (columns[None, :] <= rows[:, None])
            scores = tl.where(visible, scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            rescale = tl.exp2(best - new_best)
            weights = tl.exp2(scores - new_best[:, None])
            total = total * rescale + tl.sum(weights, axis=1)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            best = new_best
        # Every query inside the pass sees itself at least: its total is never 0.
        tl.store(
            out + head * out_head + rows[:, None] * out_token + dims[None, :],
            (acc / total[:, None]).to(out.dtype.element_ty),
            mask=inside[:, None],
        )

    return attend_packed
