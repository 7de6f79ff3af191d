"""ConvNeXt blocks run channels-last (worker.vocoder.convnext) compute what ChatTTS's and Vocos's blocks do:
the fused kernel a depthwise convolution then a layer norm, a block the module's output, a stack the
modules one after another, and the vocoder's network ChatTTS's decoder and Vocos's backbone.

The kernel is Triton's; here it runs in Triton's interpreter on the CPU (there is no GPU here), in float32
(the interpreter has no bfloat16 products), each check in a fresh interpreter as in test_attention.py.
test_vocoder.py holds the fused network to the unfused one in bf16 on a GPU.
"""

import math
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.triton_interpreter import in_triton_interpreter as in_triton_interpreter_of

pytest.importorskip("triton")


def in_triton_interpreter(check: str) -> None:
    in_triton_interpreter_of("tests.worker.vocoder.test_convnext", check)


def randomised(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter drawn at random (layer scales of 1e-6 would hide a block's branch), weights scaled
    by their fan-in so that activations stay near unit scale."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            drawn = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(drawn / math.sqrt(parameter[0].numel()) if parameter.dim() > 1 else drawn / 2)
    return module


def chattts_block(dim, intermediate, dilation, layer_scale, seed):
    from ChatTTS.model.dvae import ConvNeXtBlock

    return randomised(ConvNeXtBlock(dim, intermediate, 7, dilation, layer_scale), seed)


def vocos_block(dim, intermediate, layer_scale, seed):
    from vocos.modules import ConvNeXtBlock

    return randomised(ConvNeXtBlock(dim, intermediate, layer_scale), seed)


def check_the_kernel_is_a_depthwise_convolution_then_a_layer_norm() -> None:
    from worker.vocoder import convnext

    generator = torch.Generator().manual_seed(0)
    default_tile = convnext._LAUNCH["TILE_T"]
    # Channels a power of two and not; frames fewer than a tile (and than the convolution's reach) and
    # not a multiple of it; tiles of the default and smaller.
    for channels, frames, dilation, tile in ((96, 37, 1, default_tile), (64, 3, 2, default_tile), (96, 45, 2, 4)):
        convnext._LAUNCH = {**convnext._LAUNCH, "TILE_T": tile}
        channels_first = torch.randn(2, channels, frames, generator=generator)
        conv_weight, conv_bias, norm_weight, norm_bias = (
            torch.randn(shape, generator=generator) for shape in ((channels, 7), channels, channels, channels)
        )
        convolved = F.conv1d(
            channels_first, conv_weight[:, None], conv_bias, padding=3 * dilation, dilation=dilation, groups=channels
        )
        expected = F.layer_norm(convolved.transpose(1, 2), (channels,), norm_weight, norm_bias, 1e-6)
        # Read channels-last, and through the strides of a transposed channels-first tensor.
        for x in (channels_first.transpose(1, 2).contiguous(), channels_first.transpose(1, 2)):
            out = convnext.dwconv_layer_norm(x, conv_weight, conv_bias, norm_weight, norm_bias, dilation, 1e-6)
            assert out.is_contiguous() and out.dtype == x.dtype
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def check_with_lengths_each_row_s_frames_come_out_as_the_shorter_row_s_alone() -> None:
    from worker.vocoder import convnext

    generator = torch.Generator().manual_seed(1)
    channels, frames, dilation = 96, 45, 2
    x = torch.randn(3, frames, channels, generator=generator)
    conv_weight, conv_bias, norm_weight, norm_bias = (
        torch.randn(shape, generator=generator) for shape in ((channels, 7), channels, channels, channels)
    )
    parts = (conv_weight, conv_bias, norm_weight, norm_bias, dilation, 1e-6)
    # The whole row, one shorter than the convolution's reach, and one cut within a tile.
    lengths = torch.tensor([frames, 5, 30], dtype=torch.int32)
    out = convnext.dwconv_layer_norm(x, *parts, lengths)
    for row, length in enumerate(lengths.tolist()):
        alone = convnext.dwconv_layer_norm(x[row : row + 1, :length], *parts)
        torch.testing.assert_close(out[row, :length], alone[0], atol=1e-5, rtol=1e-5)
    # Without the lengths, the frames after a row's length are read, and its last frames are another's.
    unmasked = convnext.dwconv_layer_norm(x, *parts)
    assert (unmasked[1, :5] - out[1, :5]).abs().max() > 1e-2


def check_a_block_channels_last_is_chattts_s_and_vocos_s_block() -> None:
    from worker.vocoder.convnext import ChannelsLastBlock

    blocks = [
        chattts_block(96, 192, dilation=2, layer_scale=1e-6, seed=1),
        chattts_block(96, 192, dilation=2, layer_scale=0, seed=2),  # no layer scale
        vocos_block(96, 160, layer_scale=0.5, seed=3),
        vocos_block(96, 160, layer_scale=0, seed=4),
    ]
    x = torch.randn(2, 96, 29, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        for block in blocks:
            channels_last = ChannelsLastBlock(block, torch.float32)
            out = channels_last(x.transpose(1, 2).contiguous())
            torch.testing.assert_close(out, block(x).transpose(1, 2), atol=1e-5, rtol=1e-5)


def check_a_stack_is_its_blocks_one_after_another_and_leaves_its_input_alone() -> None:
    from worker.vocoder.convnext import ChannelsLastStack

    blocks = [chattts_block(64, 256, dilation=2, layer_scale=1e-6, seed=seed) for seed in range(3)]
    x = torch.randn(2, 64, 21, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        expected = x
        for block in blocks:
            expected = block(expected)
        stack = ChannelsLastStack(blocks, torch.float32)
        channels_last = x.transpose(1, 2).contiguous()
        before = channels_last.clone()
        for given in (channels_last, x.transpose(1, 2)):
            out = stack(given)
            assert out.is_contiguous()
            torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-5, rtol=1e-5)
        assert torch.equal(channels_last, before)


def check_the_fused_network_is_chattts_decoder_and_vocos_backbone_and_padded_windows_decode_as_their_rows() -> None:
    from ChatTTS.model.dvae import DVAE
    from vocos.pretrained import instantiate_class

    from worker.model.synthetic_assets import synthetic_config
    from worker.vocoder.vocoder import VocoderNetwork

    config = synthetic_config("tiny")
    decoder = randomised(DVAE(decoder_config=asdict(config.decoder), dim=config.decoder.idim), seed=7)
    vocos = SimpleNamespace(
        backbone=randomised(instantiate_class(args=(), init=asdict(config.vocos.backbone)), seed=8),
        head=instantiate_class(args=(), init=asdict(config.vocos.head)),
    )
    network = VocoderNetwork(decoder, vocos, torch.float32, fused=True)
    # The stacks hold the blocks' only copies.
    assert not [*network.decoder.decoder.decoder_block, *network.backbone.convnext]
    unfused = VocoderNetwork(decoder, vocos, torch.float32, fused=False)
    windows = torch.randn(2, config.gpt.hidden_size, 24, generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        expected = vocos.backbone(decoder(windows))
        torch.testing.assert_close(network.features(windows), expected, atol=1e-4, rtol=1e-4)
        # A window padded past its row (a length in mel frames, two a hidden state): the row's frames
        # come out as the row's alone, fused and not.
        alone = vocos.backbone(decoder(windows[1:, :, :15].contiguous()))[0]
        lengths = torch.tensor([48, 30])
        for padded in (network, unfused):
            torch.testing.assert_close(padded.features(windows, lengths)[1, :30], alone, atol=1e-4, rtol=1e-4)


def test_the_kernel_is_a_depthwise_convolution_then_a_layer_norm():
    in_triton_interpreter("check_the_kernel_is_a_depthwise_convolution_then_a_layer_norm")


def test_with_lengths_each_row_s_frames_come_out_as_the_shorter_row_s_alone():
    in_triton_interpreter("check_with_lengths_each_row_s_frames_come_out_as_the_shorter_row_s_alone")


def test_a_block_channels_last_is_chattts_s_and_vocos_s_block_with_and_without_a_layer_scale():
    in_triton_interpreter("check_a_block_channels_last_is_chattts_s_and_vocos_s_block")


def test_a_stack_is_its_blocks_one_after_another_and_leaves_its_input_alone():
    in_triton_interpreter("check_a_stack_is_its_blocks_one_after_another_and_leaves_its_input_alone")


def test_the_fused_network_is_chattts_decoder_and_vocos_backbone_and_padded_windows_decode_as_their_rows():
    in_triton_interpreter(
        "check_the_fused_network_is_chattts_decoder_and_vocos_backbone_and_padded_windows_decode_as_their_rows"
    )


def test_a_block_with_adaptive_layer_norm_is_refused():
    from vocos.modules import ConvNeXtBlock

    from worker.vocoder.convnext import ChannelsLastBlock

    with pytest.raises(ValueError, match="adaptive layer norm"):
        ChannelsLastBlock(ConvNeXtBlock(8, 16, 0.1, adanorm_num_embeddings=2), torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLASLt's GELU epilogue runs on a GPU")
def test_on_a_gpu_a_bf16_block_s_gelu_is_the_tanh_form_in_its_first_matmul():
    from worker.vocoder import convnext
    from worker.vocoder.convnext import ChannelsLastBlock

    block = ChannelsLastBlock(chattts_block(512, 2048, dilation=2, layer_scale=0.5, seed=1), torch.bfloat16).cuda()
    assert block.tanh_gelu
    x = torch.randn(2, 100, 512, generator=torch.Generator().manual_seed(2)).cuda().bfloat16()
    with torch.inference_mode():
        parts = (block.conv_weight, block.conv_bias, block.norm_weight, block.norm_bias, block.dilation, block.eps)
        normalised = convnext.dwconv_layer_norm(x, *parts)
        hidden = F.gelu(F.linear(normalised, block.weight_in, block.bias_in), approximate="tanh")
        expected = F.linear(hidden, block.weight_out, block.bias_out)
        branch = block.branch(x)
    # The epilogue rounds the matmul's sums once, to bfloat16, after the GELU; op by op they are rounded
    # before it too.
    torch.testing.assert_close(branch.float(), expected.float(), atol=2e-2, rtol=2e-2)
    assert not ChannelsLastBlock(chattts_block(64, 128, 2, 0.5, seed=3), torch.float32).tanh_gelu
