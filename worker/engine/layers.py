"""The GPT's Llama layer as two plain functions over fused weights, the parts of a layer on either side
of its attention, so that ``torch.compile`` can make each a few kernels.

Op by op, a layer of transformers' Llama is ~50 kernels a decode step (RMSNorm as mean, pow, rsqrt and
mul; rotary as cat, neg and mul; three projections where one would do; dtype copies), and at a
few rows a step is bound by their launches, not by the GPU's arithmetic. Here the q, k and v
projections are one matmul, as are the MLP's gate and up projections, over weights concatenated once
(the modules' own weights become views of them, so nothing is held twice); compiled, the norm, the
rotary, SiLU-and-multiply and the residual adds fuse into the matmuls' neighbours. The functions
compute what the modules compute, in the same dtypes (``tests/worker/engine/test_layers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # (q + k + v width, hidden)
    output: torch.Tensor
    post_attention_norm: torch.Tensor
    gate_up: torch.Tensor  # (2 x intermediate, hidden)
    down: torch.Tensor


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


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalised in fp32, scaled in the input's dtype."""
    wide = hidden.float()
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * wide.to(hidden.dtype)


def before_attention(
    hidden: torch.Tensor,
    input_norm: torch.Tensor,
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    shape: LayerShape,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's query, key and value, (rows, heads, length, head dim) each, rotated to their positions."""
    rows, length, _ = hidden.shape
    projected = F.linear(rms_norm(hidden, input_norm, shape.norm_eps), qkv)
    query_width = shape.heads * shape.head_dim
    kv_width = shape.kv_heads * shape.head_dim
    query, key, value = projected.split([query_width, kv_width, kv_width], dim=-1)
    query = query.view(rows, length, shape.heads, shape.head_dim).transpose(1, 2)
    key = key.view(rows, length, shape.kv_heads, shape.head_dim).transpose(1, 2)
    value = value.view(rows, length, shape.kv_heads, shape.head_dim).transpose(1, 2)
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    return query, key, value


def after_attention(
    hidden: torch.Tensor,
    attended: torch.Tensor,
    output: torch.Tensor,
    post_attention_norm: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    norm_eps: float,
) -> torch.Tensor:
    """The layer's output: the attended values (rows, heads, length, head dim) projected and added, then
    the MLP's."""
    rows, _, length, _ = attended.shape
    hidden = hidden + F.linear(attended.transpose(1, 2).reshape(rows, length, -1), output)
    gate, up = F.linear(rms_norm(hidden, post_attention_norm, norm_eps), gate_up).chunk(2, dim=-1)
    return hidden + F.linear(F.silu(gate) * up, down)
