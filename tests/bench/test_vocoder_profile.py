"""bench/vocoder.py's profile: it counts the matrix products a mel frame goes through from the networks' own
layers (ChatTTS's Decoder and Vocos's, the same whether the ConvNeXt blocks are theirs or fused), and names
the operations of one call run op by op."""

import torch

from bench.vocoder import matmul_flops_per_mel_frame
from tests.support import run_bench
from worker.model.loading import load_model
from worker.vocoder.vocoder import VocoderNetwork


def test_the_matmul_flops_a_mel_frame_are_twice_the_dense_weights_of_both_networks(tiny_settings):
    chat = load_model(tiny_settings).chat
    decoder, backbone = chat.config.decoder, chat.config.vocos.backbone.init_args
    mel_bins = chat.config.vocos.feature_extractor.init_args.n_mels
    head_outputs = chat.config.vocos.head.init_args.n_fft + 2
    # The Decoder: its two input convolutions (kernel 3), its blocks' two linear layers, its output
    # convolution (kernel 1); the DVAE's mel projection (kernel 3, no bias); Vocos's embedding (kernel 7),
    # its blocks' linear layers and the head's linear layer. The depthwise convolutions are not counted.
    weights = (
        3 * decoder.idim * decoder.bn_dim
        + 3 * decoder.bn_dim * decoder.hidden
        + decoder.n_layer * 2 * decoder.hidden * 4 * decoder.hidden
        + decoder.hidden * decoder.odim
        + 3 * decoder.odim * mel_bins
        + 7 * mel_bins * backbone.dim
        + backbone.num_layers * 2 * backbone.dim * backbone.intermediate_dim
        + backbone.dim * head_outputs
    )
    as_chattts = VocoderNetwork(chat.decoder, chat.vocos, torch.float32, fused=False)
    fused = VocoderNetwork(chat.decoder, chat.vocos, torch.bfloat16, fused=True)
    assert matmul_flops_per_mel_frame(as_chattts) == matmul_flops_per_mel_frame(fused) == 2 * weights


def test_the_profile_names_the_operations_of_one_call_run_op_by_op(tiny_assets, data_dir):
    finished = run_bench(
        "vocoder",
        *("--model", "synthetic-tiny", "--device", "cpu", "--slots", "8", "--rows", "6", "--per-call", "3"),
        "--profile",
        data_dir=data_dir,
        timeout_s=300,
    )
    assert "the same call op by op, its operations by cpu_time_total:" in finished.stdout, finished.stdout
    # The profiler's table: ATen's operations, the network's convolutions and matmuls among them.
    assert "aten::conv1d" in finished.stdout and "aten::linear" in finished.stdout, finished.stdout
    # Only the profile: no ways side by side.
    assert "| way |" not in finished.stdout
