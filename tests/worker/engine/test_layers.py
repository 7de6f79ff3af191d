"""The GPT's layers as two functions over fused weights (worker.engine.layers): they compute what
transformers' modules compute, hold no second copy of the weights, and compile to the same numbers;
over float8 weights they come close to them.

That the engine built on them draws what transformers' LlamaModel draws is test_engine.py's matter.
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from worker.engine.layers import (
    FP8_MAX,
    after_attention,
    before_attention,
    fp8_after_attention,
    fp8_before_attention,
    fp8_layer,
    fp8_weight,
    fuse_layers,
    linear,
)
from worker.model.loading import load_model

# The fp8 matmul checks run on the CPU, whose torch._scaled_mm took one scale a tensor before torch 2.14
# (the GPU machine's torch, 2.11, among them); the engine's row-wise scales are CUDA's and 2.14's.
needs_row_scaled_cpu_matmuls = pytest.mark.skipif(
    torch.torch_version.TorchVersion(torch.__version__) < "2.14",
    reason="torch before 2.14 takes one scale a tensor in _scaled_mm on the CPU",
)


@pytest.fixture
def llama(tiny_settings):
    """A fresh model's GPT in fp32: fusing rebinds its modules' weights."""
    return load_model(tiny_settings).chat.gpt.gpt


def modules_layer(layer, hidden, cos, sin):
    """One layer, module by module, causal over its positions (as the runner computed it before)."""
    attention = layer.self_attn
    rows, length, _ = hidden.shape
    normed = layer.input_layernorm(hidden)
    heads = (rows, length, -1, attention.head_dim)
    query = attention.q_proj(normed).view(heads).transpose(1, 2)
    key = attention.k_proj(normed).view(heads).transpose(1, 2)
    value = attention.v_proj(normed).view(heads).transpose(1, 2)
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    attended = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=attention.scaling)
    hidden = hidden + attention.o_proj(attended.transpose(1, 2).reshape(rows, length, -1))
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def fused_layer(weights, shape, hidden, cos, sin, *, mlp_out=None, parts=(before_attention, after_attention), scale):
    """The layer's output from its two parts, on ``hidden + mlp_out`` (a previous layer's two terms;
    by default zeros, as the first layer's)."""
    before, after = parts
    mlp_out = torch.zeros_like(hidden) if mlp_out is None else mlp_out
    hidden, query, key, value = before(hidden, mlp_out, weights.input_norm, weights.qkv, cos, sin, shape)
    attended = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale)
    hidden, mlp_out = after(
        hidden, attended, weights.output, weights.post_attention_norm, weights.gate_up, weights.down, shape.norm_eps
    )
    return hidden + mlp_out


def inputs(llama, rows=3, length=5):
    """Hidden states of ``rows`` rows at positions that differ from row to row, and their rotary."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, length, llama.config.hidden_size, generator=generator).to(llama.device)
    positions = torch.arange(length) + 7 * torch.arange(rows).unsqueeze(1)
    cos, sin = llama.rotary_emb(hidden, positions.to(llama.device))
    return hidden, cos, sin


@torch.inference_mode()
def test_each_layers_two_parts_compute_what_its_modules_compute(llama):
    hidden, cos, sin = inputs(llama)
    expected = [modules_layer(layer, hidden, cos, sin) for layer in llama.layers]
    fused, shape = fuse_layers(llama)
    scale = llama.layers[0].self_attn.scaling
    for weights, layer_expected in zip(fused, expected, strict=True):
        torch.testing.assert_close(fused_layer(weights, shape, hidden, cos, sin, scale=scale), layer_expected)


@torch.inference_mode()
def test_a_layer_takes_the_previous_layers_output_as_its_two_terms_and_adds_them_first(llama):
    hidden, cos, sin = inputs(llama)
    mlp_out = inputs(llama)[0].flip(0)
    fused, shape = fuse_layers(llama)
    scale = llama.layers[0].self_attn.scaling
    for weights in fused:
        assert torch.equal(
            fused_layer(weights, shape, hidden, cos, sin, mlp_out=mlp_out, scale=scale),
            fused_layer(weights, shape, hidden + mlp_out, cos, sin, scale=scale),
        )


@torch.inference_mode()
def test_the_modules_weights_become_views_of_the_fused_ones_and_compute_as_before(llama):
    hidden, cos, sin = inputs(llama)
    before = [modules_layer(layer, hidden, cos, sin) for layer in llama.layers]
    fused, _ = fuse_layers(llama)
    for layer, weights in zip(llama.layers, fused, strict=True):
        attention, mlp = layer.self_attn, layer.mlp
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            assert projection.weight.untyped_storage().data_ptr() == weights.qkv.untyped_storage().data_ptr()
        for projection in (mlp.gate_proj, mlp.up_proj):
            assert projection.weight.untyped_storage().data_ptr() == weights.gate_up.untyped_storage().data_ptr()
    after = [modules_layer(layer, hidden, cos, sin) for layer in llama.layers]
    for was, now in zip(before, after, strict=True):
        assert torch.equal(was, now)


def test_a_gpt_the_fused_layers_do_not_compute_is_refused(llama):
    llama.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="SiLU"):
        fuse_layers(llama)


def test_fp8_weights_keep_each_weight_to_e4m3s_precision_on_a_scale_of_its_own_output_channel():
    generator = torch.Generator().manual_seed(0)
    # Channels five orders of magnitude apart, and one of zeros: one scale for all would flush the small
    # ones to zero.
    sizes = torch.tensor([1e-3, 0.1, 1.0, 10.0, 300.0, 0.0])
    weight = torch.randn(len(sizes), 64, generator=generator) * sizes.unsqueeze(1)
    fp8 = fp8_weight(weight)
    assert (fp8.weight.dtype, fp8.weight.shape, fp8.scale.dtype, fp8.scale.shape) == (
        torch.float8_e4m3fn,
        weight.shape,
        torch.float32,
        sizes.shape,
    )
    # Each channel's largest weight becomes e4m3's largest value.
    assert fp8.weight.float().abs().amax(dim=1).tolist() == [FP8_MAX] * 5 + [0.0]
    # e4m3 keeps 3 bits after the point: a weight rounds within 1/16 of itself, or below the normal
    # range (2**-6 of the scale) within half the smallest step (2**-9).
    dequantised = fp8.weight.float() * fp8.scale.unsqueeze(1)
    allowed = weight.abs() / 16 + fp8.scale.unsqueeze(1) * 2**-10
    assert ((dequantised - weight).abs() <= allowed).all()
    assert not dequantised[-1].any()


@needs_row_scaled_cpu_matmuls
def test_a_matmul_over_fp8_weights_is_close_to_the_plain_one_in_the_inputs_dtype():
    generator = torch.Generator().manual_seed(0)
    # Rows four orders of magnitude apart: each is quantised on a scale of its own.
    x = torch.randn(3, 5, 64, generator=generator) * torch.logspace(-2, 2, 15).view(3, 5, 1)
    weight = torch.randn(48, 64, generator=generator)
    expected = F.linear(x, weight)
    product = linear(x, fp8_weight(weight))
    assert (product.shape, product.dtype) == (expected.shape, x.dtype)
    # Measured: at most 5.0% of a row's norm.
    assert ((product - expected).norm(dim=-1) / expected.norm(dim=-1)).max() < 0.08


@needs_row_scaled_cpu_matmuls
@torch.inference_mode()
def test_a_layers_parts_over_fp8_weights_come_close_to_the_plain_ones(llama):
    hidden, cos, sin = inputs(llama)
    fused, shape = fuse_layers(llama)
    scale = llama.layers[0].self_attn.scaling
    for weights in fused:
        plain = fused_layer(weights, shape, hidden, cos, sin, scale=scale)
        fp8 = fused_layer(
            fp8_layer(weights), shape, hidden, cos, sin, parts=(fp8_before_attention, fp8_after_attention), scale=scale
        )
        # Measured: ~5% of what the layer adds to its inputs.
        assert (fp8 - plain).norm() / (plain - hidden).norm() < 0.08


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the step is compiled on a GPU only")
@pytest.mark.parametrize("matmuls", ["model", "fp8"])
@torch.inference_mode()
def test_the_compiled_parts_compute_what_the_plain_ones_do(tiny_settings, matmuls):
    if matmuls == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 matmuls need fp8 tensor cores")
    llama = load_model(dataclasses.replace(tiny_settings, device="cuda", cuda_dtype="fp32")).chat.gpt.gpt
    fused, shape = fuse_layers(llama)
    plain = (before_attention, after_attention)
    if matmuls == "fp8":
        fused, plain = [fp8_layer(weights) for weights in fused], (fp8_before_attention, fp8_after_attention)
    scale = llama.layers[0].self_attn.scaling
    compiled = tuple(torch.compile(part) for part in plain)
    for rows in (1, 2, 5):  # one row is compiled apart from the others, whose count is symbolic
        hidden, cos, sin = inputs(llama, rows=rows, length=1)
        # The first layer adds zeros; the others, a previous layer's terms.
        for weights, mlp_out in zip(fused, [None, hidden.flip(0), hidden.flip(0)], strict=False):
            torch.testing.assert_close(
                fused_layer(weights, shape, hidden, cos, sin, mlp_out=mlp_out, parts=compiled, scale=scale),
                fused_layer(weights, shape, hidden, cos, sin, mlp_out=mlp_out, parts=plain, scale=scale),
                atol=1e-5,
                rtol=1e-5,
            )
