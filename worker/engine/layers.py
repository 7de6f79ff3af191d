"""The GPT's Llama layer as two plain functions over fused weights, the parts of a layer on either side
of its attention, so that ``torch.compile`` can make each a few kernels.

Op by op, a layer of transformers' Llama is ~50 kernels a decode step (RMSNorm as mean, pow, rsqrt and
mul; rotary as cat, neg and mul; three projections where one would do; dtype copies), and at a
few rows a step is bound by their launches, not by the GPU's arithmetic. Here the q, k and v
projections are one matmul, as are the MLP's gate and up projections, over weights concatenated once
(the modules' own weights become views of them, so nothing is held twice); compiled, the norm, the
rotary, SiLU-and-multiply and the residual adds fuse into the matmuls' neighbours. The functions
compute what the modules compute, in the same dtypes (``tests/worker/engine/test_layers.py``).

Their matmuls take a weight as it is or in float8 (:class:`Fp8Weight`), multiplied on fp8 tensor cores
with each input row quantised on the way in: the runner's large passes, when the setting asks for them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

# e4m3's largest finite value: each channel's or row's largest magnitude is scaled to it.
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


class Fp8Weight(NamedTuple):
    """A matmul's weight in float8: ``weight`` times ``scale`` (per output channel) is the original."""

    weight: torch.Tensor  # (out, in) float8_e4m3fn, row-major
    scale: torch.Tensor  # (out,) float32


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor | Fp8Weight  # (q + k + v width, hidden)
    output: torch.Tensor | Fp8Weight
    post_attention_norm: torch.Tensor
    gate_up: torch.Tensor | Fp8Weight  # (2 x intermediate, hidden)
    down: torch.Tensor | Fp8Weight


@dataclass(frozen=True)
class LayerShape:
    heads: int
    kv_heads: int
    head_dim: int
    norm_eps: float


def fuse_layers(llama) -> tuple[list[LayerWeights], LayerShape]:
    """The fused weights of every layer of ``llama`` (a transformers LlamaModel, left computing as before)."""
    config = llama.config
    if config.hidden_act != "silu" or getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise ValueError("the fused layers compute Llama layers with SiLU and no biases, as ChatTTS's GPT has")
    fused = []
    for layer in llama.layers:
        attention, mlp = layer.self_attn, layer.mlp
        qkv = _concatenated(attention.q_proj, attention.k_proj, attention.v_proj)
        gate_up = _concatenated(mlp.gate_proj, mlp.up_proj)
        fused.append(
            LayerWeights(
                input_norm=layer.input_layernorm.weight.detach(),
                qkv=qkv,
                output=attention.o_proj.weight.detach(),
                post_attention_norm=layer.post_attention_layernorm.weight.detach(),
                gate_up=gate_up,
                down=mlp.down_proj.weight.detach(),
            )
        )
    attention = llama.layers[0].self_attn
    shape = LayerShape(
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=attention.head_dim,
        norm_eps=config.rms_norm_eps,
    )
    return fused, shape


def _concatenated(*projections: torch.nn.Linear) -> torch.Tensor:
    """One weight for the projections, which become views of it."""
    weight = torch.cat([projection.weight.detach() for projection in projections])
    start = 0
    for projection in projections:
        rows = projection.weight.shape[0]
        projection.weight = torch.nn.Parameter(weight[start : start + rows], requires_grad=False)
        start += rows
    return weight


def fp8_layer(weights: LayerWeights) -> LayerWeights:
    """The layer with its four matmuls' weights in float8 (new tensors; the norms are shared)."""
    return replace(
        weights,
        qkv=fp8_weight(weights.qkv),
        output=fp8_weight(weights.output),
        gate_up=fp8_weight(weights.gate_up),
        down=fp8_weight(weights.down),
    )


def fp8_weight(weight: torch.Tensor) -> Fp8Weight:
    """``weight`` (out, in) in float8, each output channel scaled by its own largest magnitude."""
    quantised, scale = _rows_in_fp8(weight)
    return Fp8Weight(quantised, scale.squeeze(1))


def in_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (..., in) as float8 rows (all leading dims in one, (rows, in)), each scaled by its own
    largest magnitude, and the rows' scales, (rows, 1) float32."""
    return _rows_in_fp8(x.reshape(-1, x.shape[-1]))


def _rows_in_fp8(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    wide = rows.float()
    # An all-zero row would divide by a zero scale; with this floor it stays zeros.
    scale = wide.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (wide / scale).to(torch.float8_e4m3fn), scale


def linear(x: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> torch.Tensor:
    """``x @ weight.T`` in ``x``'s dtype; with an :class:`Fp8Weight`, on fp8 tensor cores, ``x`` quantised
    a row at a time. (On the CPU, where the tests run it, torch 2.14 takes row-wise scales; 2.11 took one
    scale a tensor there.)"""
    if not isinstance(weight, Fp8Weight):
        return F.linear(x, weight)
    quantised, scale = in_fp8(x)
    product = torch._scaled_mm(
        quantised, weight.weight.t(), scale_a=scale, scale_b=weight.scale.unsqueeze(0), out_dtype=x.dtype
    )
    return product.view(*x.shape[:-1], -1)


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalised in fp32, scaled in the input's dtype."""
    wide = hidden.float()
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * wide.to(hidden.dtype)


def before_attention(
    hidden: torch.Tensor,
    mlp_out: torch.Tensor,
    input_norm: torch.Tensor,
    qkv: torch.Tensor | Fp8Weight,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    shape: LayerShape,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's input, ``hidden + mlp_out`` (the previous layer's two terms, see :func:`after_attention`;
    the first layer's ``mlp_out`` is zeros), and its query, key and value, (rows, heads, length, head dim)
    each, the query and key rotated to their positions by ``cos`` and ``sin`` (None: left unrotated, for
    an attention that rotates them itself, see :func:`worker.engine.attention.decode_attention`)."""
    hidden = hidden + mlp_out
    rows, length, _ = hidden.shape
    projected = linear(rms_norm(hidden, input_norm, shape.norm_eps), qkv)
    query_width = shape.heads * shape.head_dim
    kv_width = shape.kv_heads * shape.head_dim
    query, key, value = projected.split([query_width, kv_width, kv_width], dim=-1)
    query = query.view(rows, length, shape.heads, shape.head_dim).transpose(1, 2)
    key = key.view(rows, length, shape.kv_heads, shape.head_dim).transpose(1, 2)
    value = value.view(rows, length, shape.kv_heads, shape.head_dim).transpose(1, 2)
    if cos is not None:
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
    return hidden, query, key, value


def after_attention(
    hidden: torch.Tensor,
    attended: torch.Tensor,
    output: torch.Tensor | Fp8Weight,
    post_attention_norm: torch.Tensor,
    gate_up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's output as two terms, ``hidden`` with the attended values (rows, heads, length, head dim)
    projected and added, and the MLP's output: their sum is the output. Whoever reads it next (the next
    layer's :func:`before_attention`, the draw) adds them in its norm's kernel; added here, after the MLP's
    last matmul, the sum was a kernel of its own in every layer."""
    rows, _, length, _ = attended.shape
    hidden = hidden + linear(attended.transpose(1, 2).reshape(rows, length, -1), output)
    gate, up = linear(rms_norm(hidden, post_attention_norm, norm_eps), gate_up).chunk(2, dim=-1)
    return hidden, linear(F.silu(gate) * up, down)


# The fp8 passes' parts: the same computation in code objects of their own. torch.compile's dynamo keeps
# its compiled variants and its recompile limit (8) per code object; sharing the parts above, the bf16
# and fp8 passes pushed it past the limit (``tensor 'qkv' dtype mismatch``), dynamo fell back to running
# them op by op, and the fp32 copies of the inputs quantised there ran an H100 out of memory.


def fp8_before_attention(
    hidden: torch.Tensor,
    mlp_out: torch.Tensor,
    input_norm: torch.Tensor,
    qkv: Fp8Weight,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    shape: LayerShape,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`before_attention` over a float8 projection, in a code object of its own so that dynamo
    compiles it apart (see above)."""
    return before_attention(hidden, mlp_out, input_norm, qkv, cos, sin, shape)


def fp8_after_attention(
    hidden: torch.Tensor,
    attended: torch.Tensor,
    output: Fp8Weight,
    post_attention_norm: torch.Tensor,
    gate_up: Fp8Weight,
    down: Fp8Weight,
    norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`after_attention` over float8 projections, in a code object of its own so that dynamo
    compiles it apart (see above)."""
    return after_attention(hidden, attended, output, post_attention_norm, gate_up, down, norm_eps)
