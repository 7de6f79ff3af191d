"""The vocoder decodes rows of any lengths in shared batches of windows, each row exactly as ChatTTS does alone."""

import copy
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from worker.engine.vocoder import Vocoder, plan_windows
from worker.model import LoadedModel
from worker.synthetic_assets import synthetic_config


@pytest.fixture(scope="module")
def vocoder(synthesizer):
    return synthesizer.vocoder


def decoded_alone(chat, states):
    """The row as stock ChatTTS decodes it: ``Chat._decode_to_wavs`` of a batch of one."""
    return chat._decode_to_wavs([states.clone()], True)[0]


def random_hidden_states(chat, frames, seed):
    # The tiny GPT's hidden states come out of a norm layer: unit scale, as these.
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(frames, chat.config.gpt.hidden_size, generator=generator)


def test_the_plan_covers_every_frame_once_and_keeps_only_frames_that_see_no_window_edge():
    for size, context in ((4, 1), (9, 4), (52, 13), (208, 52)):
        for frames in [*range(0, 3 * size + 2), 10 * size + 7]:
            windows = plan_windows(frames, size, context)
            kept = [frame for window in windows for frame in range(window.keep_start, window.keep_stop)]
            assert kept == list(range(frames)), (frames, size, context)
            for window in windows:
                assert window.stop - window.start == min(size, frames)
                assert 0 <= window.start <= window.keep_start < window.keep_stop <= window.stop <= frames
                assert window.start == 0 or window.keep_start - window.start >= context
                assert window.stop == frames or window.stop - window.keep_stop >= context


def test_a_window_without_room_between_its_contexts_is_refused():
    with pytest.raises(ValueError, match="keeps nothing"):
        plan_windows(100, 26, 13)


def test_rows_of_any_lengths_decode_together_exactly_as_each_alone(synthesizer, vocoder):
    chat = synthesizer.model.chat
    window = vocoder.window_frames
    # Shorter than, exactly and just over one window; several windows, the last of them partly kept; empty.
    lengths = [1, 7, window - 5, window, window + 1, 2 * window + 3, 4 * window - 1, 0, 7]
    rows = [random_hidden_states(chat, frames, seed) for seed, frames in enumerate(lengths)]
    decoded = vocoder.decode(rows)
    assert len(decoded) == len(rows)
    for states, samples in zip(rows, decoded, strict=True):
        expected = decoded_alone(chat, states) if len(states) else np.zeros(0, dtype=np.float32)
        assert samples.dtype == np.float32 and samples.shape == expected.shape, len(states)
        if len(states):
            assert np.abs(samples - expected).max() < 1e-4, len(states)


def test_windows_of_different_rows_share_batches_of_one_shape(synthesizer, vocoder):
    chat = synthesizer.model.chat
    window, per_batch = vocoder.window_frames, 4
    long_lengths, short_lengths = [window + 1, 2 * window, 3 * window], [window - 3, window - 3]
    rows = [random_hidden_states(chat, frames, seed) for seed, frames in enumerate([*long_lengths, *short_lengths, 0])]
    long_windows = sum(len(vocoder.plan(frames)) for frames in long_lengths)
    assert len(vocoder.plan(long_lengths[0])) < per_batch < long_windows  # so the first batch mixes rows

    shapes = []
    hook = chat.decoder.register_forward_pre_hook(lambda module, inputs: shapes.append(tuple(inputs[0].shape)))
    try:
        Vocoder(synthesizer.model, max_windows_per_batch=per_batch).decode(rows)
    finally:
        hook.remove()
    width = chat.config.gpt.hidden_size
    full_batches, rest = divmod(long_windows, per_batch)
    long_batches = [(per_batch, width, window)] * full_batches + [(rest, width, window)] * (rest > 0)
    assert shapes == [*long_batches, (2, width, window - 3)]


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
