"""The runner's pure parts (worker.engine.runner): a decode step's input and its draw, functions of the
slots' state that the GPU runs compiled, and the checks it makes at start. The engine's tests
(test_engine.py) hold what the steps add up to."""

import pytest
import torch

from chattts_farm.settings import SettingsError
from worker.engine.layers import rms_norm
from worker.engine.runner import (
    DECODE_ROW_STEP,
    PREFILL_GRAPH_TOKENS,
    SplitHeads,
    bucket_for,
    check_fp8_matmuls,
    code_logits,
    compiled_exactly,
    draw,
    prefill_token_buckets,
    row_buckets,
    split_heads,
    step_input,
)
from worker.engine.sampler import NO_TOKEN, REPETITION_WINDOW, RowSampling

SLOTS, WIDTH, CODEBOOKS, VOCAB = 40, 64, 4, 626
EOS = VOCAB - 1


def slot_state(device: str) -> dict:
    """Every slot's state as the runner keeps it, at random: some slots finished, some near their end,
    some with EOS still blocked, recent tokens with unfilled places."""
    generator = torch.Generator().manual_seed(0)

    def integers(low, high, *shape):
        return torch.randint(low, high, shape, generator=generator)

    def uniform(*shape):
        return torch.rand(shape, generator=generator)

    slots = SLOTS + 1
    state = dict(
        norm=(uniform(WIDTH) + 0.5).bfloat16(),
        heads=torch.randn(CODEBOOKS, VOCAB, WIDTH, generator=generator) / WIDTH**0.5,
        steps=integers(0, 50, slots),
        finished=uniform(slots) < 0.2,
        recent=integers(NO_TOKEN, VOCAB, slots, REPETITION_WINDOW, CODEBOOKS),
        sampling=RowSampling(
            temperature=uniform(slots) + 0.1,
            top_p=uniform(slots).double(),
            top_k=integers(1, 30, slots),
            repetition_penalty=uniform(slots) + 1,
            seed=integers(0, 2**32, slots),
        ),
        min_tokens=integers(0, 5, slots),
        end_at=integers(1, 60, slots),
        lengths=integers(0, 50, slots),
        ended_by=integers(0, 3, slots),
    )
    return {"norm_eps": 1e-5} | {
        name: RowSampling(*(field.to(device) for field in value.__dict__.values()))
        if isinstance(value, RowSampling)
        else value.to(device)
        for name, value in state.items()
    }


def devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.mark.parametrize("device", devices())
def test_a_draw_reads_the_slots_state_and_writes_none_of_it(device):
    state = slot_state(device)
    before = {name: _flat(value) for name, value in state.items()}
    slots = torch.tensor([3, 0, 17], device=device)
    drawn = draw(
        slots, torch.randn(3, WIDTH, device=device), torch.randn(3, WIDTH, device=device), eos_token=EOS, **state
    )
    assert drawn.tokens.shape == (3, CODEBOOKS) and torch.equal(drawn.codes, drawn.tokens.int())
    assert torch.equal(drawn.step, state["steps"][slots])
    for name, value in state.items():
        assert torch.equal(_flat(value), before[name]), name


def test_a_draw_hands_back_the_normed_hidden_states_in_the_norms_dtype_unrounded():
    # Kept as the norm makes them (bfloat16 on a GPU): the float32 the heads read adds no bits to store.
    state = slot_state("cpu")
    hidden, mlp_out = torch.randn(2, 3, WIDTH).bfloat16()
    drawn = draw(torch.tensor([3, 0, 17]), hidden, mlp_out, eos_token=EOS, **state)
    assert drawn.hidden.dtype == torch.bfloat16
    assert torch.equal(drawn.hidden, rms_norm(hidden + mlp_out, state["norm"], state["norm_eps"]))


def with_split_heads(state: dict) -> dict:
    return state | {"heads": split_heads(state["heads"])}


def test_split_heads_hold_each_float32_weight_to_16_bits_as_a_high_and_a_low_bfloat16_term():
    heads = slot_state("cpu")["heads"]
    split = split_heads(heads)
    assert isinstance(split, SplitHeads) and split.weights.terms.dtype == torch.bfloat16
    high, low = split.weights.terms.float().view(CODEBOOKS, VOCAB, 2, WIDTH).unbind(dim=2)
    # The high term is the weight rounded to bfloat16 (8 bits); the low term rounds what is left.
    assert torch.equal(high, heads.bfloat16().float())
    assert ((high + low - heads).abs() <= heads.abs() * 2**-16).all()


def test_logits_over_split_heads_are_the_float32_heads_to_within_their_rounding():
    state = slot_state("cpu")
    hidden = torch.randn(5, WIDTH, generator=torch.Generator().manual_seed(2)).bfloat16()
    exact = code_logits(hidden, state["heads"])
    split = code_logits(hidden, split_heads(state["heads"]))
    assert split.shape == exact.shape == (5, CODEBOOKS, VOCAB) and split.dtype == torch.float32
    # Measured: ~3e-6 of the largest logit; bfloat16 heads alone are off by ~2e-3 of it.
    assert (split - exact).abs().max() < 1e-5 * exact.abs().max()


@pytest.mark.parametrize("split", [False, True], ids=["float32 heads", "split heads"])
def test_it_compiles_whole_with_no_graph_break(split):
    # A break would cut the compiled draw into pieces with the op-by-op kernels between them.
    state = slot_state("cpu")
    state = with_split_heads(state) if split else state
    explained = torch._dynamo.explain(draw)(
        torch.arange(3), torch.randn(3, WIDTH), torch.randn(3, WIDTH), eos_token=EOS, **state
    )
    assert explained.graph_count == 1 and explained.graph_break_count == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the runner compiles the draw on a GPU only")
@pytest.mark.parametrize("split", [False, True], ids=["float32 heads", "split heads"])
def test_compiled_it_decides_what_it_decides_op_by_op_at_any_row_count(split):
    # Only on a GPU: inductor's CPU kernels sum in an order of the processor's vector width, and two
    # machines' compiled norms differ in the last bit.
    device = "cuda"
    state = slot_state(device)
    state = with_split_heads(state) if split else state
    compiled = compiled_exactly(draw)
    generator = torch.Generator().manual_seed(1)
    # One row is compiled apart from the others, whose count is symbolic.
    for rows in (1, 2, 5, 17, SLOTS):
        slots = torch.randperm(SLOTS, generator=generator)[:rows].to(device)
        hidden, mlp_out = torch.randn(2, rows, WIDTH, generator=generator).to(device, torch.bfloat16)
        expected = draw(slots, hidden, mlp_out, eos_token=EOS, **state)
        got = compiled(slots, hidden, mlp_out, eos_token=EOS, **state)
        for name, want, have in zip(expected._fields, expected, got, strict=True):
            assert torch.equal(have, want), (rows, name)


@pytest.mark.parametrize("device", devices())
def test_a_step_input_compiled_is_the_one_op_by_op(device):
    # Sums of four embeddings and integer arithmetic: the same on any processor, compiled or not.
    generator = torch.Generator().manual_seed(2)
    code_embeddings = torch.randn(CODEBOOKS, VOCAB, WIDTH, generator=generator).to(device)
    compiled = compiled_exactly(step_input)
    for rows in (1, 2, 5, SLOTS):
        tokens = torch.randint(0, VOCAB, (rows, CODEBOOKS), generator=generator).to(device)
        prompt_length, step = (torch.randint(1, 80, (rows,), generator=generator).to(device) for _ in range(2))
        finished = (torch.rand(rows, generator=generator) < 0.3).to(device)
        arguments = (tokens, code_embeddings, prompt_length, step, finished, torch.bfloat16)
        inputs, column, taking_part = step_input(*arguments)
        assert inputs.shape == (rows, 1, WIDTH) and inputs.dtype == torch.bfloat16
        assert torch.equal(column, prompt_length + step - 1)
        assert torch.equal(taking_part, torch.where(finished, -1, column))
        for want, have in zip((inputs, column, taking_part), compiled(*arguments), strict=True):
            assert torch.equal(have, want), rows


def _flat(value) -> torch.Tensor:
    if isinstance(value, float):
        return torch.tensor([value], dtype=torch.float64)
    parts = list(value.__dict__.values()) if isinstance(value, RowSampling) else [value]
    return torch.cat([part.flatten().double().cpu() for part in parts])


def test_row_counts_double_up_to_their_step_then_go_up_by_it_to_the_most():
    assert row_buckets(300, 64) == [1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 300]
    assert row_buckets(2048, 256) == [1, 2, 4, 8, 16, 32, 64, 128, *range(256, 2049, 256)]
    assert row_buckets(5, 64) == [1, 2, 4, 5]


def test_a_decode_step_of_many_rows_computes_fewer_than_64_rows_that_take_no_part():
    assert bucket_for(row_buckets(2048, DECODE_ROW_STEP), 1300) == 1344


def test_a_prefill_pass_is_padded_to_64_tokens_up_to_512_then_to_512_up_to_the_budget():
    assert prefill_token_buckets(2_000) == [64, 128, 192, 256, 320, 384, 448, 512, 1024, 1536, 2000]
    assert prefill_token_buckets(100) == [64, 100]
    assert prefill_token_buckets(40) == [40]
    # A step's 512 prompts of the standard workload (~84,000 tokens) pad by less than 512.
    assert bucket_for(prefill_token_buckets(512 * 400), 84_100) == 84_480


def test_the_prefill_passes_captured_as_graphs_are_few_whatever_the_budget():
    # 23 (64 to 8,192 tokens) at a budget of 512 prompts of 400 tokens, where every bucket would be 407.
    for budget in (512 * 400, 64 * 400, 2**20):
        assert len([tokens for tokens in prefill_token_buckets(budget) if tokens <= PREFILL_GRAPH_TOKENS]) == 23


@pytest.mark.parametrize("capability", [(7, 5), (8, 0), (8, 6)])
def test_fp8_matmuls_are_refused_on_a_gpu_without_fp8_tensor_cores_naming_the_setting(capability):
    major, minor = capability
    with pytest.raises(SettingsError, match=rf"CHATTTS_FARM_MATMUL_DTYPE=fp8 .* 8\.9 or later.* is {major}\.{minor}"):
        check_fp8_matmuls(capability)


def test_fp8_matmuls_run_on_ada_hopper_and_later_gpus():
    for capability in [(8, 9), (9, 0), (10, 0)]:
        check_fp8_matmuls(capability)
