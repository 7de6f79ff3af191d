"""The slot attention kernels (worker.engine.attention) write each slot's new position into its block and attend
as masked SDPA does, reading only each slot's positions through its block table, split or not; the prefill's
attends each of a pass's packed prompts as that prompt's own causal attention, and so does its reference.

The kernels are Triton's; here they run in Triton's interpreter on the CPU (there is no GPU here), which
executes the same program the GPU compiles. The interpreter is chosen when Triton is imported, so each
check runs in a fresh interpreter. The CUDA graph test in test_engine.py runs the kernels on a GPU.
"""

import pytest
import torch
import torch.nn.functional as F

from tests.triton_interpreter import in_triton_interpreter as in_triton_interpreter_of

pytest.importorskip("triton")


# A long split: the length the kernel's launch settings were chosen with (worker.engine.attention).
LONG_SPLIT = 512


def in_triton_interpreter(check: str) -> None:
    in_triton_interpreter_of("tests.worker.engine.test_attention", check)


def masked_reference(query, keys, values, lengths, scale):
    visible = (torch.arange(keys.shape[2]).unsqueeze(0) < lengths.unsqueeze(1))[:, None, None, :]
    return F.scaled_dot_product_attention(
        query, keys.float(), values.float(), attn_mask=visible, scale=scale, enable_gqa=True
    )


def shuffled_table(rows, context, block_positions, generator):
    """Block tables for ``rows`` rows of ``context`` positions over a pool whose blocks lie in random order."""
    width = context // block_positions
    return torch.randperm(rows * width, generator=generator).view(rows, width)


def paged(cache, table):
    """A (rows, kv heads, context, dim) cache as a pool of blocks where ``table`` puts them."""
    rows, kv_heads, context, dim = cache.shape
    width = table.shape[1]
    block_positions = context // width
    pool = torch.empty(rows * width, kv_heads, block_positions, dim, dtype=cache.dtype)
    blocks = cache.view(rows, kv_heads, width, block_positions, dim).transpose(1, 2)
    pool[table.flatten()] = blocks.reshape(rows * width, kv_heads, block_positions, dim)
    return pool


def unpaged(pool, table):
    """The inverse of :func:`paged`."""
    rows, width = table.shape
    _, kv_heads, block_positions, dim = pool.shape
    return pool[table].transpose(1, 2).reshape(rows, kv_heads, width * block_positions, dim)


def check_each_slot_writes_its_new_position_and_attends_over_its_own_filled_columns(device: str = "cpu") -> None:
    from worker.engine import attention
    from worker.engine.attention import SHORT_SPLIT_COLUMNS, decode_attention, splits_for

    generator = torch.Generator().manual_seed(0)
    slots, heads, kv_heads, block_positions, dim = 8, 4, 2, 16, 16
    context = 2 * LONG_SPLIT + 128
    # The new position first, within a block, at a block's, a tile's and a split's edges, and last in the cache.
    columns = torch.tensor([0, 6, 15, 64, LONG_SPLIT - 1, LONG_SPLIT, LONG_SPLIT + 1, context - 1])
    # Products on the CUDA cores and on the tensor cores (whose weights are bfloat16 for a bfloat16
    # cache, as flash attention's are, float16 for fp8, tf32 for float32: ~1e-3 from exact). The
    # interpreter has no bfloat16 products: the model's dtype is checked on a GPU.
    cache_dtypes = {"cpu": ((torch.float32, 1e-5),), "cuda": ((torch.bfloat16, 2e-2),)}[device]
    for cache_dtype, tolerance in (*cache_dtypes, (torch.float8_e4m3fn, 1e-5)):
        query = torch.randn(slots, heads, 1, dim, generator=generator)
        # Values the cache's dtype holds exactly: how a value between two fp8 numbers rounds is the
        # GPU's conversion, which Triton's interpreter does not copy (it rounds ties and carries apart).
        new_key = torch.randn(slots, kv_heads, 1, dim, generator=generator).to(cache_dtype).float()
        new_value = torch.randn(slots, kv_heads, 1, dim, generator=generator).to(cache_dtype).float()
        keys = torch.randn(slots, kv_heads, context, dim, generator=generator).to(cache_dtype)
        values = torch.randn(slots, kv_heads, context, dim, generator=generator).to(cache_dtype)
        expected_keys, expected_values = keys.clone(), values.clone()
        rows = torch.arange(slots)
        expected_keys[rows, :, columns] = new_key[:, :, 0].to(cache_dtype)
        expected_values[rows, :, columns] = new_value[:, :, 0].to(cache_dtype)
        table = shuffled_table(slots, context, block_positions, generator)
        key_pool, value_pool = paged(keys, table), paged(values, table)

        expected = masked_reference(query, expected_keys, expected_values, columns + 1, 0.25)
        size = min(cache_dtype.itemsize, 2)
        for tensor_cores in (False, True):
            attention._LAUNCH = {**attention._LAUNCH, size: {**attention._LAUNCH[size], "TENSOR_CORES": tensor_cores}}
            # On the tensor cores, or with the fp8 launch's products in float16 pairs: ~1e-3 from exact.
            widened = tensor_cores or attention._LAUNCH[size]["HALF_PRODUCTS"]
            allowed = max(tolerance, 2e-3) if widened else tolerance
            # Long splits or short ones, a program per split or fewer programs taking several splits
            # each, or the whole table as one split (no merge): the same answer.
            for split_columns, split_programs in (
                (context, 1),
                *((LONG_SPLIT, programs) for programs in (splits_for(context, LONG_SPLIT), 2, 1)),
                *((SHORT_SPLIT_COLUMNS, programs) for programs in (splits_for(context, SHORT_SPLIT_COLUMNS), 5)),
            ):
                on_device = (query, new_key, new_value, key_pool.clone(), value_pool.clone(), table, columns)
                on_device = [tensor.to(device) for tensor in on_device]
                attended = decode_attention(
                    *on_device, 0.25, split_programs=split_programs, split_columns=split_columns
                ).cpu()
                written_keys, written_values = on_device[3].cpu(), on_device[4].cpu()

                # Written in the cache's dtype, in the row's block, and attended to as written.
                assert torch.equal(unpaged(written_keys, table).float(), expected_keys.float())
                assert torch.equal(unpaged(written_values, table).float(), expected_values.float())
                torch.testing.assert_close(attended, expected, atol=allowed, rtol=allowed)


def check_columns_past_a_slots_new_position_are_never_read() -> None:
    from worker.engine.attention import SHORT_SPLIT_COLUMNS, decode_attention

    generator = torch.Generator().manual_seed(1)
    query = torch.randn(3, 2, 1, 16)
    new_key, new_value = torch.randn(3, 2, 1, 16), torch.randn(3, 2, 1, 16)
    table = shuffled_table(3, 3 * LONG_SPLIT, 64, generator)
    keys, values = (paged(torch.randn(3, 2, 3 * LONG_SPLIT, 16, generator=generator), table) for _ in range(2))
    # The third row takes no part.
    columns = torch.tensor([40, LONG_SPLIT + 100, -1])
    before = decode_attention(
        query,
        new_key,
        new_value,
        keys.clone(),
        values.clone(),
        table,
        columns,
        0.25,
        split_programs=3,
        split_columns=LONG_SPLIT,
    )
    # Every position past a row's new one: the rest of its block, and its later blocks.
    for row, column in enumerate(columns.tolist()):
        first = column + 1
        block, offset = divmod(first, 64)
        for pool in (keys, values):
            pool[table[row, block], :, offset:] = float("nan")
            pool[table[row, block + 1 :]] = float("nan")
    # Whether each split has its program or one program takes them all, long splits or short or the whole
    # table as one, none reads past its row's length.
    for split_columns, split_programs in (
        (LONG_SPLIT, 3),
        (LONG_SPLIT, 1),
        (SHORT_SPLIT_COLUMNS, 24),
        (3 * LONG_SPLIT, 1),
    ):
        attended = decode_attention(
            query,
            new_key,
            new_value,
            keys,
            values,
            table,
            columns,
            0.25,
            split_programs=split_programs,
            split_columns=split_columns,
        )
        torch.testing.assert_close(attended[:2], before[:2])
        # A row taking no part attends to nothing, whether a merge writes its output or not.
        assert torch.equal(attended[2], torch.zeros_like(attended[2]))
    # A row taking no part reads and writes nothing.
    assert keys[table[2]].isnan().all() and values[table[2]].isnan().all()


def check_the_query_and_new_key_come_unrotated_and_are_rotated_to_each_rows_position(device: str = "cpu") -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from worker.engine.attention import SHORT_SPLIT_COLUMNS, decode_attention

    generator = torch.Generator().manual_seed(2)
    slots, heads, kv_heads, dim, context = 4, 4, 2, 16, 256
    # The new position first, within a split, at a split's edge, and last in the cache.
    columns = torch.tensor([0, 17, SHORT_SPLIT_COLUMNS, context - 1])
    # A Llama rotary's table: each pair of dimensions (d, d + dim / 2) turns at its own rate.
    angles = torch.arange(context).unsqueeze(1) * torch.rand(dim // 2, generator=generator)
    rotary = torch.stack([torch.cat([angles, angles], dim=1).cos(), torch.cat([angles, angles], dim=1).sin()])
    query = torch.randn(slots, heads, 1, dim, generator=generator)
    new_key, new_value = torch.randn(2, slots, kv_heads, 1, dim, generator=generator)
    table = shuffled_table(slots, context, 16, generator)
    keys, values = (paged(torch.randn(slots, kv_heads, context, dim, generator=generator), table) for _ in range(2))
    cos, sin = rotary[:, columns].unsqueeze(2)  # (rows, one position, dim) each
    rotated_query, rotated_key = apply_rotary_pos_emb(query, new_key, cos, sin)
    # One split a row, or short splits over several programs: each program rotates the query itself.
    for split_columns, split_programs in ((context, 1), (SHORT_SPLIT_COLUMNS, 2)):
        runs = []
        for inputs, table_of_rotary in (((rotated_query, rotated_key), None), ((query, new_key), rotary)):
            on_device = [tensor.to(device) for tensor in (*inputs, new_value, keys.clone(), values.clone(), table)]
            attended = decode_attention(
                *on_device,
                columns.to(device),
                0.25,
                split_programs=split_programs,
                split_columns=split_columns,
                rotary=None if table_of_rotary is None else table_of_rotary.to(device),
            )
            runs.append((attended.cpu(), on_device[3].cpu(), on_device[4].cpu()))
        (expected, expected_keys, expected_values), (attended, written_keys, written_values) = runs
        # The rotation's products and sum in another order (a fused multiply-add): a float32 rounding apart.
        torch.testing.assert_close(attended, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(written_keys, expected_keys, atol=1e-6, rtol=1e-6)
        assert torch.equal(written_values, expected_values)


def test_the_kernel_rotates_the_query_and_the_new_key_it_is_handed_unrotated():
    in_triton_interpreter("check_the_query_and_new_key_come_unrotated_and_are_rotated_to_each_rows_position")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_kernel_rotates_them_on_a_gpu():
    check_the_query_and_new_key_come_unrotated_and_are_rotated_to_each_rows_position("cuda")


def test_a_rotary_table_of_another_shape_is_refused():
    from worker.engine.attention import decode_attention

    query, key = torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 16)
    pool, table = torch.zeros(2, 2, 16, 16), torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="rotary"):
        decode_attention(query, key, key, pool, pool, table, torch.tensor([0]), 0.25, rotary=torch.zeros(2, 16, 8))


def test_each_slot_writes_its_new_position_and_attends_over_its_own_columns_in_the_model_dtype_and_fp8():
    in_triton_interpreter("check_each_slot_writes_its_new_position_and_attends_over_its_own_filled_columns")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_in_the_models_dtype_and_fp8():
    check_each_slot_writes_its_new_position_and_attends_over_its_own_filled_columns("cuda")


def test_columns_past_a_slots_new_position_and_rows_taking_no_part_are_never_read():
    in_triton_interpreter("check_columns_past_a_slots_new_position_are_never_read")


def test_a_busy_step_reads_each_slots_whole_table_as_one_split_and_a_step_of_few_slots_short_ones():
    from worker.engine.attention import BUSY_PROGRAMS, SHORT_SPLIT_COLUMNS, split_columns_for, split_programs_for

    heads, context = 12, 2_464
    busy_rows = -(-BUSY_PROGRAMS // heads)
    assert split_columns_for(busy_rows, heads, context) == context
    assert split_programs_for(busy_rows, heads, splits=1) == 1
    # Too few programs with one a slot and head: the context in short splits, over several programs each.
    assert split_columns_for(busy_rows - 1, heads, context) == SHORT_SPLIT_COLUMNS
    assert split_programs_for(1, heads, splits=context // SHORT_SPLIT_COLUMNS) > 1


def packed(lengths, *, heads=4, kv_heads=2, dim=16, dtype=torch.float32, seed=0):
    """A pass of prompts of ``lengths`` tokens one after another: query, key, value and each token's start."""
    generator = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    query = torch.randn(heads, tokens, dim, generator=generator).to(dtype)
    key, value = (torch.randn(kv_heads, tokens, dim, generator=generator).to(dtype) for _ in range(2))
    lengths = torch.tensor(lengths)
    starts = torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
    return query, key, value, starts


def each_prompt_alone(query, key, value, lengths, scale):
    """Each prompt's causal attention over its own tokens, computed apart from the others."""
    attended, first = [], 0
    for length in lengths:
        part = slice(first, first + length)
        attended.append(
            F.scaled_dot_product_attention(
                query[None, :, part].float(),
                key[None, :, part].float(),
                value[None, :, part].float(),
                is_causal=True,
                scale=scale,
                enable_gqa=True,
            )[0]
        )
        first += length
    return torch.cat(attended, dim=1)


# Prompts of different lengths, none a multiple of a tile: tiles of queries span prompt boundaries, one
# prompt is a token alone, one is longer than two tiles; then a padding tail, each of its tokens its own start.
PROMPT_LENGTHS = [37, 1, 70, 5, 150, 20]
PADDING = 13


def check_packed_prompts_each_attend_over_their_own_tokens_up_to_themselves(device: str = "cpu") -> None:
    from worker.engine import attention
    from worker.engine.attention import prefill_attention

    lengths = PROMPT_LENGTHS + [1] * PADDING
    dtype, tolerance = {"cpu": (torch.float32, 1e-5), "cuda": (torch.bfloat16, 2e-2)}[device]
    query, key, value, starts = packed(lengths, dtype=dtype)
    expected = each_prompt_alone(query, key, value, lengths, 0.25)
    # Tiles of 64 queries and keys, as the GPU runs them, and small ones: more of them span a boundary.
    for tiles in ({"QUERIES": 64, "KEYS": 64}, {"QUERIES": 16, "KEYS": 32}):
        attention._PREFILL_LAUNCH = {**attention._PREFILL_LAUNCH, **tiles}
        on_device = [tensor.to(device) for tensor in (query, key, value, starts)]
        attended = prefill_attention(*on_device, 0.25, max(lengths), kernel=True).cpu()
        assert attended.shape == query.shape and attended.dtype == dtype
        torch.testing.assert_close(attended.float(), expected, atol=tolerance, rtol=tolerance)


def test_packed_prompts_each_attend_over_their_own_tokens_up_to_themselves_in_the_kernel():
    in_triton_interpreter("check_packed_prompts_each_attend_over_their_own_tokens_up_to_themselves")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_packed_prompts_on_a_gpu_in_the_models_dtype():
    check_packed_prompts_each_attend_over_their_own_tokens_up_to_themselves("cuda")


def test_packed_prompts_each_attend_over_their_own_tokens_in_the_reference_whatever_its_windows(monkeypatch):
    from worker.engine import attention
    from worker.engine.attention import prefill_attention

    lengths = PROMPT_LENGTHS + [1] * PADDING
    query, key, value, starts = packed(lengths)
    expected = each_prompt_alone(query, key, value, lengths, 0.25)
    # Windows of queries smaller than a prompt, and one over the whole pass.
    for queries in (16, 64, sum(lengths)):
        monkeypatch.setattr(attention, "REFERENCE_QUERIES", queries)
        attended = prefill_attention(query, key, value, starts, 0.25, max(lengths), kernel=False)
        torch.testing.assert_close(attended, expected, atol=1e-5, rtol=1e-5)
