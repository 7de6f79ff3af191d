"""ConvNeXt blocks run channels-last, their depthwise convolution and layer norm one Triton kernel.

ChatTTS's DVAE decoder and Vocos's backbone are stacks of one ConvNeXt block (ChatTTS's a copy of
Vocos's): a depthwise convolution over time in the channels-first (batch, channels, frames) layout, a
transpose to (batch, frames, channels) for the layer norm and the two linear layers, the layer scale,
a transpose back and the residual sum. On an H200 (docs/performance.md: 96 windows of 320 frames in
bf16, 35.5 ms a batch) strided elementwise copies (those transposes, the layer scale and the residual
sum on transposed tensors) took 22.5% of the vocoder's GPU time and ATen's depthwise convolution 21.5%
(~330 GB/s), more than the matrix products (~20%).

Here a stack keeps its activations channels-last from its first block to its last, transposed once at
each end; the depthwise convolution reads that layout directly, fused with the layer norm after it (the
activations read once, a tile and its halo, and written once: the convolution's output is never
stored); the layer scale is folded into the second linear layer's weight and bias; and the residual sum
is one contiguous add.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch import nn
from torch.nn import functional

# Frames a program convolves and normalises (a tile of all channels), and its warps. On an H200
# (`bench.vocoder --launch-sweep`, 256 rows a call, eager) 4 frames and 4 warps decoded 10,918 kept
# audio-s/s, 16 and 4 10,537, 32 and 2 5,880: small tiles keep a program's registers from spilling.
_LAUNCH = {"TILE_T": 4, "num_warps": 4}


def layer_scale(block: nn.Module) -> torch.Tensor | None:
    """A ConvNeXt block's layer scale: ``gamma`` in Vocos's block, ``weight`` in ChatTTS's copy of it."""
    return block.gamma if hasattr(block, "gamma") else block.weight


def dwconv_layer_norm(
    x: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    dilation: int,
    eps: float,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """``layer_norm(depthwise_conv1d(x))`` in the channels-last layout: (batch, frames, channels) of any
    strides to a contiguous (batch, frames, channels) in ``x``'s dtype, the arithmetic in float32.

    The convolution is a same-length one, zero-padded by ``dilation * (kernel // 2)`` frames each side:
    ``conv_weight`` is (channels, kernel), kernel odd; the norm is over the channels. With ``lengths``
    (batch,) int32, each row's frames from its length on read as that padding, so that its first
    ``length`` frames come out as the row of that length would alone; the frames after are not its.
    """
    rows, frames, channels = x.shape
    kernel = conv_weight.shape[1]
    out = torch.empty((rows, frames, channels), dtype=x.dtype, device=x.device)
    tile = _LAUNCH["TILE_T"]
    tiles = -(-frames // tile)
    _kernel()[(rows * tiles,)](
        x,
        conv_weight,
        conv_bias,
        norm_weight,
        norm_bias,
        out,
        frames,
        channels,
        tiles,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        out.stride(0),
        out.stride(1),
        eps,
        x if lengths is None else lengths,  # not read without lengths
        KERNEL=kernel,
        DILATION=dilation,
        CHANNELS_POWER=1 << (channels - 1).bit_length(),
        HAS_LENGTHS=lengths is not None,
        **_LAUNCH,
    )
    return out


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def convolve_and_normalise(
        x,
        conv_weight,
        conv_bias,
        norm_weight,
        norm_bias,
        out,
        frames,
        channels,
        tiles,
        x_row,
        x_frame,
        x_channel,
        out_row,
        out_frame,
        eps,
        lengths,
        KERNEL: tl.constexpr,
        DILATION: tl.constexpr,
        CHANNELS_POWER: tl.constexpr,
        TILE_T: tl.constexpr,
        HAS_LENGTHS: tl.constexpr,
    ):
        program = tl.program_id(0)
        row = (program // tiles).to(tl.int64)
        frame = (program % tiles) * TILE_T + tl.arange(0, TILE_T)
        channel = tl.arange(0, CHANNELS_POWER)
        is_channel = channel < channels
        source = x + row * x_row
        row_frames = frames
        if HAS_LENGTHS:
            row_frames = tl.load(lengths + row)
        total = tl.zeros((TILE_T, CHANNELS_POWER), dtype=tl.float32)
        # Tap k reads frame t + (k - KERNEL // 2) * DILATION; frames outside the row (before its start,
        # from its length on) read as the zero padding. The taps' tiles overlap, so all but the first
        # mostly hit the cache.
        for tap in tl.static_range(KERNEL):
            read = frame + (tap - KERNEL // 2) * DILATION
            inside = (read >= 0) & (read < row_frames)
            values = tl.load(
                source + read[:, None] * x_frame + channel[None, :] * x_channel,
                mask=inside[:, None] & is_channel[None, :],
                other=0.0,
            )
            weight = tl.load(conv_weight + channel * KERNEL + tap, mask=is_channel, other=0.0)
            total += values.to(tl.float32) * weight.to(tl.float32)[None, :]
        total += tl.load(conv_bias + channel, mask=is_channel, other=0.0).to(tl.float32)[None, :]
        # The lanes past the channels hold zeros, so the sum is the channels'; the deviations are masked.
        mean = tl.sum(total, axis=1) / channels
        deviation = tl.where(is_channel[None, :], total - mean[:, None], 0.0)
        variance = tl.sum(deviation * deviation, axis=1) / channels
        normalised = deviation * tl.rsqrt(variance + eps)[:, None]
        scale = tl.load(norm_weight + channel, mask=is_channel, other=0.0).to(tl.float32)
        shift = tl.load(norm_bias + channel, mask=is_channel, other=0.0).to(tl.float32)
        result = normalised * scale[None, :] + shift[None, :]
        tl.store(
            out + row * out_row + frame[:, None] * out_frame + channel[None, :],
            result.to(out.dtype.element_ty),
            mask=(frame < frames)[:, None] & is_channel[None, :],
        )

    return convolve_and_normalise


class ChannelsLastBlock(nn.Module):
    """A ConvNeXt block (ChatTTS's or Vocos's, without adaptive norm) on (batch, frames, channels)
    activations, its weights copied once in ``dtype``, the layer scale folded into the second linear layer.
    """

    def __init__(self, block: nn.Module, dtype: torch.dtype):
        super().__init__()
        if getattr(block, "adanorm", False):
            # Vocos's backbone asserts a bandwidth id for it, which ChatTTS never passes: never met here.
            raise ValueError("a ConvNeXt block with adaptive layer norm has no channels-last form here")
        conv, norm = block.dwconv, block.norm
        (kernel,), (dilation,), (padding,) = conv.kernel_size, conv.dilation, conv.padding
        same_length = conv.stride == (1,) and kernel % 2 == 1 and padding == dilation * (kernel // 2)
        if conv.groups != conv.in_channels or not same_length:
            raise ValueError(f"{conv} is not a same-length depthwise convolution")
        self.dilation, self.eps = dilation, norm.eps

        def copied(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.detach().to(dtype=dtype, copy=True).contiguous()

        # Buffers, so that ``.to()`` moves them, and outside the state dict, which stays ChatTTS's.
        for name, tensor in {
            "conv_weight": conv.weight[:, 0],
            "conv_bias": conv.bias,
            "norm_weight": norm.weight,
            "norm_bias": norm.bias,
            "weight_in": block.pwconv1.weight,
            "bias_in": block.pwconv1.bias,
        }.items():
            self.register_buffer(name, copied(tensor), persistent=False)
        # gamma * (W x + b) is (gamma W) x + gamma b; folded in float32, rounded once to ``dtype``.
        scale = layer_scale(block)
        weight_out, bias_out = block.pwconv2.weight.detach().float(), block.pwconv2.bias.detach().float()
        if scale is not None:
            scale = scale.detach().float()
            weight_out, bias_out = scale[:, None] * weight_out, scale * bias_out
        self.register_buffer("weight_out", copied(weight_out), persistent=False)
        self.register_buffer("bias_out", copied(bias_out), persistent=False)
        # In bfloat16 the GELU's tanh form, at most 4.7e-4 from the erf form of ChatTTS's and Vocos's blocks
        # (below bfloat16's rounding of what it makes, 3.9e-3 at 1), runs in cuBLASLt's matmul epilogue on
        # CUDA: the wide activations written once, not written, read and written again.
        self.tanh_gelu = dtype == torch.bfloat16

    def branch(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output less its residual, for (batch, frames, channels) ``x`` (each row's first
        ``lengths`` frames, as :func:`dwconv_layer_norm`'s)."""
        normalised = dwconv_layer_norm(
            x, self.conv_weight, self.conv_bias, self.norm_weight, self.norm_bias, self.dilation, self.eps, lengths
        )
        if self.tanh_gelu and normalised.is_cuda:
            rows, frames, channels = normalised.shape
            flat = normalised.view(rows * frames, channels)
            hidden = torch._addmm_activation(self.bias_in, flat, self.weight_in.t(), use_gelu=True)
            hidden = hidden.view(rows, frames, -1)
        else:
            hidden = functional.linear(normalised, self.weight_in, self.bias_in)
            hidden = functional.gelu(hidden, approximate="tanh" if self.tanh_gelu else "none")
        return functional.linear(hidden, self.weight_out, self.bias_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x)


class ChannelsLastStack(nn.Module):
    """ConvNeXt blocks applied one after another to (batch, frames, channels) activations, as
    :class:`ChannelsLastBlock` each; the result is contiguous (batch, frames, channels). With ``lengths``,
    each row's first ``length`` frames are those of the row of that length alone (:func:`dwconv_layer_norm`):
    the blocks' only reads across frames are their convolutions'."""

    def __init__(self, blocks: Iterable[nn.Module], dtype: torch.dtype):
        super().__init__()
        self.blocks = nn.ModuleList(ChannelsLastBlock(block, dtype) for block in blocks)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        # The one transpose of a channels-first caller's activations (a no-op for channels-last ones).
        summed = x.contiguous()
        for block in self.blocks:
            branch = block.branch(summed, lengths)
            # The caller's tensor stays as it was: only a sum the stack made is added to in place.
            summed = summed + branch if summed is x else summed.add_(branch)
        return summed
