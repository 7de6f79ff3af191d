"""The vocoder decodes rows of any lengths in shared batches of windows, each row exactly as ChatTTS does alone
(in float32 on the CPU; in bf16, near it)."""

import copy
import itertools
import math
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from worker.model.loading import LoadedModel
from worker.model.synthetic_assets import synthetic_config
from worker.vocoder.convnext import layer_scale
from worker.vocoder.vocoder import (
    WINDOW_STEP_FRAMES,
    Vocoder,
    VocoderNetwork,
    WindowGraphs,
    batch_bucket,
    plan_windows,
    shared_sizes,
)


@pytest.fixture(scope="module")
def vocoder(synthesizer):
    return synthesizer.vocoder


def decoded_alone(chat, states):
    """The row as stock ChatTTS decodes it: ``Chat._decode_to_wavs`` of a batch of one."""
    return chat._decode_to_wavs([states.clone()], True)[0]


def decoded_with_batch_shapes(vocoder, rows):
    """``vocoder.decode(rows)``, and the (windows, width, frames) shape of each batch its network ran."""
    shapes = []
    hook = vocoder.network.register_forward_pre_hook(lambda module, inputs: shapes.append(tuple(inputs[0].shape)))
    try:
        return vocoder.decode(rows), shapes
    finally:
        hook.remove()


def random_hidden_states(chat, frames, seed):
    # The tiny GPT's hidden states come out of a norm layer: unit scale, as these.
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(frames, chat.config.gpt.hidden_size, generator=generator)


def test_the_plan_covers_every_frame_once_and_keeps_only_frames_that_see_no_window_edge():
    for context, step, most in ((1, 4, 8), (4, 8, 36), (13, 32, 208), (52, 32, 832)):
        longest = most // step * step
        for frames in [*range(0, 3 * most + 2), 10 * most + 7]:
            windows = plan_windows(frames, context, step, most)
            kept = [frame for window in windows for frame in range(window.keep_start, window.keep_stop)]
            assert kept == list(range(frames)), (frames, context, step, most)
            (size,) = {window.size for window in windows} or {0}
            assert size % step == 0 and size <= longest, (frames, size)
            if len(windows) == 1:  # the row whole, padded to the step
                assert size - step < frames <= size and windows[0].stop == frames
            elif windows:
                assert frames > longest and {window.stop - window.start for window in windows} == {size}
            for window in windows:
                assert 0 <= window.start <= window.keep_start < window.keep_stop <= window.stop <= frames
                assert window.start == 0 or window.keep_start - window.start >= context
                assert window.stop == frames or window.stop - window.keep_stop >= context


def test_a_row_decodes_its_frames_once_but_for_the_overlaps_and_the_rounding_of_its_windows():
    context, step, most = 52, 32, 832
    for frames in range(1, 3000, 7):
        windows = plan_windows(frames, context, step, most)
        decoded = sum(window.size for window in windows)
        if frames <= most:  # the standard workload's rows (107-330 frames): once, and the rounding
            assert len(windows) == 1 and decoded < frames + step, frames
            continue
        overlaps = (len(windows) - 1) * (2 * context + 1)
        assert decoded < frames + overlaps + len(windows) * step, frames
        # As few windows as fit: one fewer would need windows longer than the longest.
        fewer = len(windows) - 1
        assert fewer < 2 or math.ceil((frames + (fewer - 1) * (2 * context + 1)) / fewer) > most, frames


def test_a_window_without_room_between_its_contexts_is_refused():
    with pytest.raises(ValueError, match="keeps nothing"):
        plan_windows(100, 13, 32, 26)


@pytest.mark.parametrize(
    ("count", "bucket"), [(1, 1), (2, 2), (3, 3), (4, 4), (5, 6), (7, 8), (9, 12), (13, 16), (17, 24)]
)
def test_a_graph_s_batch_is_the_next_bucket(count, bucket):
    assert batch_bucket(count, 256) == bucket
    assert batch_bucket(count, count) == count


def test_on_the_cpu_the_networks_are_float32_copies_run_op_by_op(synthesizer, vocoder):
    chat = synthesizer.model.chat
    assert vocoder.graphs is None
    assert {parameter.dtype for parameter in vocoder.network.parameters()} == {torch.float32}
    stock = {id(tensor) for tensor in [*chat.decoder.parameters(), *chat.vocos.parameters()]}
    assert not stock & {id(tensor) for tensor in vocoder.network.parameters()}


def test_the_audio_that_reads_nothing_back_is_torch_istft_s_and_with_lengths_each_windows_frames_alone(vocoder):
    network = vocoder.network
    generator = torch.Generator().manual_seed(3)
    bins = network.n_fft // 2 + 1
    # The head's log magnitudes (up to a few, as the exponential's clip allows) and phases, frames-major.
    log_magnitudes = torch.randn(3, 40, bins, generator=generator) - 1
    head = torch.cat([log_magnitudes, 3 * torch.randn(3, 40, bins, generator=generator)], dim=-1)
    log_magnitude, phase = head.transpose(1, 2).chunk(2, dim=1)
    spectrum = log_magnitude.exp().clip(max=1e2) * (phase.cos() + 1j * phase.sin())

    def torch_istft(spectrum):
        return torch.istft(spectrum, network.n_fft, network.hop_length, network.n_fft, network.window, center=True)

    expected = torch_istft(spectrum)
    peak = float(expected.abs().max())
    torch.testing.assert_close(network.audio_without_check(head), expected, atol=1e-6 * peak, rtol=0)
    lengths = torch.tensor([40, 9, 25])
    # The CPU's own: torch.istft of each window's frames, to the bit.
    for padded, tolerance in (
        (network.audio_without_check(head, lengths), 1e-6 * peak),
        (network.istft(spectrum, lengths), 0),
    ):
        assert padded.shape == expected.shape and padded.isfinite().all()  # where no frame adds to a sample too
        for window, frames in enumerate(lengths.tolist()):
            alone = torch_istft(spectrum[window, :, :frames])
            torch.testing.assert_close(padded[window, : alone.numel()], alone, atol=tolerance, rtol=0)


def test_in_bf16_the_audio_stays_near_float32_s_and_the_istft_head_stays_float32(synthesizer, vocoder):
    chat = synthesizer.model.chat
    half = Vocoder(synthesizer.model, max_windows_per_batch=8, dtype=torch.bfloat16)
    assert half.network.backbone.embed.weight.dtype == torch.bfloat16
    assert half.network.spectrum.weight.dtype == torch.float32
    rows = [random_hidden_states(chat, frames, seed) for seed, frames in enumerate([5, 3 * vocoder.context_frames])]
    for exact, rounded in zip(vocoder.decode(rows), half.decode(rows), strict=True):
        assert rounded.dtype == np.float32 and rounded.shape == exact.shape
        assert 0 < np.abs(rounded - exact).max() < 0.05 * np.abs(exact).max()


def test_rows_of_any_lengths_decode_together_exactly_as_each_alone(synthesizer, vocoder):
    chat = synthesizer.model.chat
    longest, context = vocoder.max_window_frames, vocoder.context_frames
    # Whole (padded, padded, padded, a multiple of the step), two of the longest windows, three; empty; a
    # twin of a short one.
    lengths = [1, 7, 2 * context + 3, 3 * WINDOW_STEP_FRAMES, 2 * longest - 2 * context - 1, 2 * longest, 0, 7]
    assert [len(vocoder.plan(frames)) for frames in lengths] == [1, 1, 1, 1, 2, 3, 0, 1]
    rows = [random_hidden_states(chat, frames, seed) for seed, frames in enumerate(lengths)]
    decoded = vocoder.decode(rows)
    assert len(decoded) == len(rows)
    for states, samples in zip(rows, decoded, strict=True):
        expected = decoded_alone(chat, states) if len(states) else np.zeros(0, dtype=np.float32)
        assert samples.dtype == np.float32 and samples.shape == expected.shape, len(states)
        if len(states):
            assert np.abs(samples - expected).max() < 1e-4, len(states)


def test_rows_of_different_lengths_share_batches_of_one_shape(synthesizer):
    chat = synthesizer.model.chat
    # Batches that cost nothing: each window size its own.
    vocoder, per_batch = Vocoder(synthesizer.model, max_windows_per_batch=3, batch_cost_frames=0), 3
    context, longest = vocoder.context_frames, vocoder.max_window_frames
    # Rows whole in windows of one size (three lengths, one a multiple of the step), rows of two windows of
    # one size (two lengths), a row shorter than a step.
    whole, windowed = [2 * WINDOW_STEP_FRAMES + extra for extra in (3, 13, 32)], [longest + 1, longest + 9]
    (size,) = {window.size for frames in windowed for window in vocoder.plan(frames)}
    assert all(len(vocoder.plan(frames)) == 2 for frames in windowed)
    lengths = [*whole, *windowed, context, 0]
    rows = [random_hidden_states(chat, frames, seed) for seed, frames in enumerate(lengths)]

    decoded, shapes = decoded_with_batch_shapes(vocoder, rows)
    width, step = chat.config.gpt.hidden_size, WINDOW_STEP_FRAMES
    assert shapes == [(1, width, step), (per_batch, width, 3 * step), (per_batch, width, size), (1, width, size)]
    for states, samples in zip(rows[:-1], decoded[:-1], strict=True):
        assert np.abs(samples - decoded_alone(chat, states)).max() < 1e-4, len(states)


def test_a_call_s_window_sizes_share_batches_where_the_batches_saved_cost_more_than_the_padding():
    def most(size):
        return 8

    counts = {64: 3, 96: 4, 128: 1, 320: 8}

    def cost(decoded_at, batch_cost):
        total = 0
        for size in set(decoded_at.values()):
            windows = sum(count for planned, count in counts.items() if decoded_at[planned] == size)
            full, rest = divmod(windows, 8)
            padded = 8 * full + (batch_bucket(rest, 8) if rest else 0)
            total += padded * size + (full + (rest > 0)) * batch_cost
        return total

    sizes = sorted(counts)
    # Every way to cut the ascending sizes into runs, each padded to its largest.
    ways = []
    for cuts in itertools.product([False, True], repeat=len(sizes) - 1):
        ends = [index for index, cut in enumerate(cuts) if cut] + [len(sizes) - 1]
        ways.append({size: sizes[next(end for end in ends if end >= index)] for index, size in enumerate(sizes)})
    for batch_cost in (0, 50, 200, 1000, 5000, 10**6):
        chosen = shared_sizes(counts, most, batch_cost)
        assert cost(chosen, batch_cost) == min(cost(way, batch_cost) for way in ways), batch_cost
    # Batches that cost nothing: each size its own (3 and 4 windows fill their buckets).
    assert shared_sizes(counts, most, 0) == {64: 64, 96: 96, 128: 128, 320: 320}
    # Dear batches: as few as fit (two of 8), each padded the least.
    assert shared_sizes(counts, most, 10**6) == {64: 128, 96: 128, 128: 128, 320: 320}
    assert shared_sizes({}, most, 200) == {}


def test_windows_padded_to_another_size_s_batch_decode_as_their_rows_alone(synthesizer):
    chat = synthesizer.model.chat
    vocoder = Vocoder(synthesizer.model, max_windows_per_batch=8, batch_cost_frames=10**6)
    longest = vocoder.max_window_frames
    lengths = [5, WINDOW_STEP_FRAMES + 1, 3 * WINDOW_STEP_FRAMES, 2 * longest + 3]
    rows = [random_hidden_states(chat, frames, seed) for seed, frames in enumerate(lengths)]
    decoded, shapes = decoded_with_batch_shapes(vocoder, rows)
    # One batch: the whole rows' windows padded to the long row's windows' size.
    (size,) = {window.size for window in vocoder.plan(lengths[-1])}
    assert shapes == [(3 + len(vocoder.plan(lengths[-1])), chat.config.gpt.hidden_size, size)]
    for states, samples in zip(rows, decoded, strict=True):
        assert np.abs(samples - decoded_alone(chat, states)).max() < 1e-4, len(states)


def test_a_window_padded_past_its_row_decodes_as_the_row_only_with_its_length(synthesizer, vocoder):
    chat, network = synthesizer.model.chat, vocoder.network
    row = random_hidden_states(chat, 2 * vocoder.context_frames + 3, seed=5)
    expected = decoded_alone(chat, row)
    padded = torch.cat([row, torch.zeros(WINDOW_STEP_FRAMES - 3, row.shape[1])]).T[None].contiguous()
    with torch.inference_mode():
        with_length = network(padded, torch.tensor([row.shape[0]], dtype=torch.int32))[0, : expected.size]
        without = network(padded)[0, : expected.size]
    assert np.abs(with_length.numpy() - expected).max() < 1e-4
    # Zeros read as frames of the row would change its end: every layer's padding is zeros again.
    assert np.abs(without.numpy() - expected).max() > 1e-3


def test_an_empty_call_and_empty_rows_give_empty_audio(vocoder, synthesizer):
    assert vocoder.decode([]) == []
    empty = torch.zeros(0, synthesizer.model.chat.config.gpt.hidden_size)
    (samples,) = vocoder.decode([empty])
    assert samples.dtype == np.float32 and samples.shape == (0,)


def test_the_context_is_the_furthest_a_frame_reaches_through_decoder_and_vocos(synthesizer, vocoder):
    """Measured in float64, where the tiny model's far reach (its layer scales are 1e-6) is not lost in rounding."""
    chat = synthesizer.model.chat
    decoder, vocos = copy.deepcopy(chat.decoder).double(), copy.deepcopy(chat.vocos).double()
    frames, changed_frame = 6 * vocoder.context_frames, 3 * vocoder.context_frames
    states = random_hidden_states(chat, frames, seed=0).double()
    nudged = states.clone()
    nudged[changed_frame] += 1.0
    with torch.inference_mode():
        before, after = (vocos.decode(decoder(row.T[None].contiguous()))[0] for row in (states, nudged))
    changed = torch.nonzero(before != after).squeeze(1)
    first, last = (int(sample) // vocoder.samples_per_frame for sample in (changed[0], changed[-1]))
    assert changed_frame - first == vocoder.context_frames
    assert last - changed_frame <= vocoder.context_frames


@pytest.mark.parametrize(("scale", "context_frames"), [("tiny", 13), ("full", 52)])
def test_the_context_follows_the_scale_s_layers(scale, context_frames):
    """In mel frames: conv_in 1 + 1, ConvNeXt 6 a layer and out_conv 1 (Decoder); embed 3 and 3 a layer
    (Vocos); 2 for the ISTFT (1024 over a 256 hop). Two mel frames a hidden state."""
    from ChatTTS.model.dvae import DVAE
    from vocos.pretrained import instantiate_class

    config = synthetic_config(scale)
    with torch.device("meta"):  # the layers' shapes without their weights (the full scale's are large)
        chat = SimpleNamespace(
            config=config,
            decoder=DVAE(decoder_config=asdict(config.decoder), dim=config.decoder.idim),
            vocos=SimpleNamespace(
                backbone=instantiate_class(args=(), init=asdict(config.vocos.backbone)),
                head=instantiate_class(args=(), init=asdict(config.vocos.head)),
            ),
        )
    vocoder = Vocoder(LoadedModel(chat=chat, info=None, device=torch.device("meta")), max_windows_per_batch=1)
    assert vocoder.context_frames == context_frames
    assert vocoder.samples_per_frame == 512


def test_a_streamed_piece_needs_only_the_context_its_audio_reads_above_rounding(synthesizer, vocoder):
    """The tiny model's layer scales are 1e-6: its frames read far less than the receptive field allows."""
    context = vocoder.measure_stream_context()
    assert 0 < context < vocoder.context_frames
    row = random_hidden_states(synthesizer.model.chat, 5 * vocoder.context_frames, seed=42)
    (whole,) = vocoder.decode([row])
    per_frame = vocoder.samples_per_frame

    def kept_audio(keep_from, keep_to, context):
        start = max(0, keep_from - context)
        (samples,) = vocoder.decode([row[start : keep_to + context]])
        return samples[(keep_from - start) * per_frame : (keep_to - start) * per_frame]

    for keep_from, keep_to in [(0, 12), (20, 30), (31, 55)]:
        expected = whole[keep_from * per_frame : keep_to * per_frame]
        assert np.abs(kept_audio(keep_from, keep_to, context) - expected).max() < 1e-4
        # The measured context is needed: with none, the audio near the piece's edges is another
        # (and a hop short: the ISTFT's last frame lacks its right neighbour).
        bare = kept_audio(keep_from, keep_to, 0)
        assert np.abs(bare - expected[: bare.size]).max() > 1e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA graph path needs a GPU")
def test_on_a_gpu_graphs_captured_beside_queued_work_decode_what_the_network_decodes_op_by_op(tiny_settings):
    from dataclasses import replace

    from worker.model.loading import load_model

    # fp32, so that the graphs and the op-by-op network agree to rounding.
    model = load_model(replace(tiny_settings, device="cuda", cuda_dtype="fp32"))
    graphed, eager = Vocoder(model, 64, graphs=True), Vocoder(model, 64, graphs=False)
    busy = torch.randn(4096, 4096, device="cuda")
    for batch in (1, 3, 5, 3):  # rows of one window each: three batch buckets, the last met again
        rows = [random_hidden_states(model.chat, 3 * WINDOW_STEP_FRAMES, seed).cuda() for seed in range(batch)]
        for _ in range(20):  # work queued ahead on the stream when a graph is captured
            busy = busy @ busy / 64
        expected = eager.decode(rows)
        for samples, reference in zip(graphed.decode(rows), expected, strict=True):
            assert samples.shape == reference.shape
            assert np.abs(samples - reference).max() < 1e-4
    assert len(graphed.graphs) == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA graph path needs a GPU")
def test_on_a_gpu_every_window_size_is_captured_ahead_in_every_batch_and_met_later_without_a_capture(tiny_settings):
    from dataclasses import replace

    from worker.model.loading import load_model

    model = load_model(replace(tiny_settings, device="cuda"))
    vocoder = Vocoder(model, 8)
    sizes = range(WINDOW_STEP_FRAMES, vocoder.max_window_frames + 1, WINDOW_STEP_FRAMES)
    graphs = sum(len({batch_bucket(count, vocoder.windows_per_batch(size)) for count in range(1, 9)}) for size in sizes)
    assert vocoder.capture_windows() == graphs
    for batch in (1, 5, 8):
        # A streamed segment's first piece, shorter than a step; rows whole (padded and not) and windowed.
        for frames in (WINDOW_STEP_FRAMES // 2 + 1, WINDOW_STEP_FRAMES, 5 * vocoder.max_window_frames):
            rows = [random_hidden_states(model.chat, frames, seed).cuda() for seed in range(batch)]
            assert len(vocoder.decode(rows)) == batch
    assert len(vocoder.graphs) == graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA graph path needs a GPU")
def test_on_a_gpu_graphs_that_share_their_buffers_each_give_their_own_batchs_audio(tiny_settings):
    from dataclasses import replace

    from worker.model.loading import load_model

    # fp32, so that the graphs and the op-by-op network agree to rounding.
    model = load_model(replace(tiny_settings, device="cuda", cuda_dtype="fp32"))
    graphed, eager = Vocoder(model, 8), Vocoder(model, 8, graphs=False)
    graphed.capture_windows()
    # Rows of four window sizes in batches of one launch, in two orders: each batch replays a graph that
    # writes the same buffers, and each batch's audio must have left them before the next replays. The
    # longest windows fill a batch of 8 and leave 5 in a graph of 6, padded.
    rows = [random_hidden_states(model.chat, frames, frames).cuda() for frames in (64, 96, 64, 1200, 700, 96)]
    assert sorted(len(graphed.plan(row.shape[0])) for row in rows) == [1, 1, 1, 1, 5, 8]
    for ordered in (rows, rows[::-1]):
        for samples, reference in zip(graphed.decode(ordered), eager.decode(ordered), strict=True):
            assert samples.shape == reference.shape
            assert np.abs(samples - reference).max() < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuFFT runs on a GPU")
def test_on_a_gpu_a_windows_audio_does_not_depend_on_how_many_windows_share_its_batch(tiny_settings):
    from dataclasses import replace

    from worker.model.loading import load_model

    model = load_model(replace(tiny_settings, device="cuda", cuda_dtype="fp32"))
    network = Vocoder(model, 8, graphs=False).network
    windows = torch.stack([random_hidden_states(model.chat, 192, seed).T for seed in range(8)]).cuda()
    with torch.inference_mode():
        alone = torch.cat([network(windows[index : index + 1]) for index in range(8)])
        # Kernels chosen by batch size round differently (6e-5 of the peak at 8, H200); cuFFT's inverse
        # given imaginary DC and Nyquist bins was 2% of the peak off at 6 and 8.
        for batch in (5, 6, 8):
            together = network(windows[:batch])
            assert (together - alone[:batch]).abs().max() <= 1e-3 * alone.abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned host memory needs a GPU")
def test_on_a_gpu_each_row_lands_whole_in_pinned_host_memory_of_its_own(tiny_settings):
    """The windows' kept audio is copied to its row's place on the host by the stream, so the engine's thread
    neither waits for it nor joins windows; a row holds no other row's memory (a request may keep it long)."""
    from dataclasses import replace

    from worker.model.loading import load_model

    model = load_model(replace(tiny_settings, device="cuda", cuda_dtype="fp32"))
    graphed, eager = Vocoder(model, 8), Vocoder(model, 8, graphs=False)
    rows = [random_hidden_states(model.chat, frames, frames).cuda() for frames in (64, 700, 0, 96)]
    launched = graphed.launch(rows)
    decoded = launched.result()
    assert [row.is_pinned() for row in launched.rows] == [True, True, False, True]  # the empty row holds nothing
    assert [row.numel() for row in launched.rows] == [samples.size for samples in decoded]
    assert len({row.data_ptr() for row in launched.rows if row.numel()}) == 3
    for samples, reference in zip(decoded, eager.decode(rows), strict=True):
        np.testing.assert_allclose(samples, reference, rtol=0, atol=1e-4)


def test_off_a_gpu_no_window_is_captured(vocoder):
    assert vocoder.capture_windows() == 0


def test_a_bf16_network_s_head_is_its_float32_linear_layer_over_bf16_features_to_within_the_weights_split(synthesizer):
    chat = synthesizer.model.chat
    network = VocoderNetwork(chat.decoder, chat.vocos, torch.bfloat16, fused=False)
    dim = network.spectrum.in_features
    features = torch.randn(3, 40, dim, generator=torch.Generator().manual_seed(4)).bfloat16()
    with torch.inference_mode():
        exact, split = network.spectrum(features.float()), network.head(features)
    assert split.dtype == torch.float32 and split.shape == exact.shape
    # The weights' two bfloat16 terms hold 16 of their 24 bits: measured 2.3e-6 of the largest output;
    # bfloat16 weights alone were off by 3.0e-3 of it.
    assert float((split - exact).abs().max()) < 1e-4 * float(exact.abs().max())
    # A float32 network keeps the float32 layer itself.
    assert VocoderNetwork(chat.decoder, chat.vocos, torch.float32, fused=False).spectrum_terms is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused ConvNeXt blocks run on a GPU")
def test_on_a_gpu_the_fused_network_in_bf16_stays_near_the_unfused_one_eager_and_in_graphs_padded_or_not(synthesizer):
    chat = synthesizer.model.chat
    decoder, vocos = copy.deepcopy(chat.decoder).cuda(), copy.deepcopy(chat.vocos).cuda()
    # The tiny model's layer scales are 1e-6, which would hide what the blocks' branches add.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for block in [*decoder.decoder.decoder_block, *vocos.backbone.convnext]:
            scale = layer_scale(block)
            scale.copy_(0.2 + torch.rand(scale.shape, generator=generator))
    fused = VocoderNetwork(decoder, vocos, torch.bfloat16)
    assert fused.decoder_blocks is not None  # the default on CUDA
    unfused = VocoderNetwork(decoder, vocos, torch.bfloat16, fused=False)
    exact = VocoderNetwork(decoder, vocos, torch.float32, fused=False)
    width = chat.config.gpt.hidden_size
    windows = torch.stack([random_hidden_states(chat, 3 * WINDOW_STEP_FRAMES, seed).T for seed in range(3)]).cuda()
    # A window whole and two padded past their rows, as the vocoder batches them.
    lengths = torch.tensor([3 * WINDOW_STEP_FRAMES, 70, 41], dtype=torch.int32, device="cuda")
    windows[1, :, 70:] = windows[2, :, 41:] = 0
    with torch.inference_mode():
        reference, rounded, eager = (network(windows, lengths) for network in (exact, unfused, fused))
        samples_per_frame = width // chat.config.decoder.idim * fused.hop_length
        graphed = WindowGraphs(fused, width, samples_per_frame, windows.device)(windows, lengths, 4)
    peak = float(reference.abs().max())
    for audio in (rounded, eager):
        assert 0 < float((audio - reference).abs().max()) < 0.05 * peak
    assert float((eager - rounded).abs().max()) < 0.05 * peak
    torch.testing.assert_close(graphed, eager, atol=1e-4, rtol=0)
