"""Whisper's greedy decoding over a static cache (worker/asr/greedy.py) draws the tokens whisper.decode draws,
with the options the ASR gate decodes with, on espeak-ng speech, tones and noise."""

import copy
import dataclasses
import functools
from collections import Counter

import numpy as np
import pytest
import torch
import whisper
from whisper.decoding import DecodingTask, SuppressBlank
from whisper.tokenizer import get_tokenizer

from worker.asr.backends import at_16k, synthetic_whisper
from worker.asr.greedy import CompiledEncoder, GreedyDecoder, blank_tokens, suppressed_tokens

SAID = "the weather today is cold and rainy with strong winds from the north"
OTHER = "my grandmother bakes bread on sunday mornings"
LIMIT = 24  # tokens a clip, as the gate's limit for a short text


def whisper_tokens(model, mels, language, sample_len):
    """What whisper.decode draws, with the options worker.asr.backends.Whisper decoded with before."""
    options = whisper.DecodingOptions(
        language=language,
        temperature=0.0,
        sample_len=sample_len,
        without_timestamps=True,
        fp16=model.device.type == "cuda",
    )
    return [result.tokens for result in whisper.decode(model, mels, options)]


@pytest.fixture(scope="module")
def model():
    """Whisper tiny's architecture with random weights that tell clips apart. synthetic_whisper's own draw
    the token they were fed, over and over, whatever the audio (a token's embedding outweighs the rest of
    its residual stream): a decoder that ignored the audio, the position or its cache would draw the same.
    The token embedding scaled down and the text decoder's blocks' weights up, what is drawn depends on
    all three. One audio encoder block of four: the encoder is Whisper's own, run as whisper.decode runs
    it, and four take a CPU core half a second a clip."""
    hearing = synthetic_whisper("synthetic-tiny")
    hearing.encoder.blocks = hearing.encoder.blocks[:1]
    with torch.no_grad():
        hearing.decoder.token_embedding.weight.mul_(0.1)
        for name, weight in hearing.decoder.blocks.named_parameters():
            if name.endswith("weight") and weight.ndim == 2:
                weight.mul_(4)
    return hearing


@pytest.fixture(scope="module")
def mels(speak):
    """Log-mel spectrograms as Whisper makes them of three clips: a sentence, part of another, and noise."""
    said, other = (at_16k(*speak(text)) for text in (SAID, OTHER))
    noise = 0.1 * np.random.default_rng(0).standard_normal(30_000).astype(np.float32)
    clips = (said, other[:20_000], noise)
    return torch.stack([whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(clip)), 80) for clip in clips])


@pytest.fixture(scope="module")
def sounds():
    """Log-mel spectrograms of three clips made without espeak-ng (the GPU machine has none): a rising
    tone, two tones at once, and noise."""
    seconds = np.arange(32_000) / 16_000
    rising = 0.3 * np.sin(2 * np.pi * (200 + 400 * seconds) * seconds)
    chord = 0.2 * (np.sin(2 * np.pi * 440 * seconds) + np.sin(2 * np.pi * 660 * seconds))
    noise = 0.1 * np.random.default_rng(0).standard_normal(30_000)
    clips = [torch.from_numpy(clip.astype(np.float32)) for clip in (rising, chord, noise)]
    return torch.stack([whisper.log_mel_spectrogram(whisper.pad_or_trim(clip), 80) for clip in clips])


@pytest.fixture(scope="module")
def expected(mels):
    """whisper.decode's tokens of all the clips, or of one (``clip``) alone; each asked for once a module."""

    @functools.cache
    def tokens(model, language, sample_len, clip=None):
        return whisper_tokens(model, mels if clip is None else mels[clip : clip + 1], language, sample_len)

    return tokens


def end_made_likelier(model, drawn, likelihood):
    """The model with its end token made likelier, ``likelihood`` times the embedding of the token it drew
    most (of the rows ``drawn``), so that rows end after a few tokens, not all at once."""
    most = Counter(token for tokens in drawn for token in tokens).most_common(1)[0][0]
    ending = copy.deepcopy(model)
    end = get_tokenizer(True, num_languages=model.num_languages).eot
    with torch.no_grad():
        embedding = ending.decoder.token_embedding.weight
        embedding[end] += likelihood * embedding[most]
    return ending


def short_context(model, context):
    """The model with a text context of ``context`` positions: whisper.decode stops once its tokens outgrow it."""
    short = copy.deepcopy(model)
    short.dims = dataclasses.replace(model.dims, n_text_ctx=context)
    short.decoder.positional_embedding = torch.nn.Parameter(model.decoder.positional_embedding[:context].clone())
    return short


@pytest.mark.parametrize("language", ["en", "zh"])
def test_a_batch_draws_the_tokens_whisper_decode_draws(model, mels, expected, language):
    """Three clips in a pass of four rows: one row of padding."""
    assert GreedyDecoder(model, max_rows=4).decode(mels, language, LIMIT) == expected(model, language, LIMIT)
    assert len({tuple(tokens) for tokens in expected(model, language, LIMIT)}) == len(mels)  # heard apart


@pytest.mark.parametrize("language", ["en", "zh"])
def test_each_clip_alone_draws_the_tokens_whisper_decode_draws(model, mels, expected, language):
    decoder = GreedyDecoder(model, max_rows=4)
    for clip in range(len(mels)):
        assert decoder.decode(mels[clip : clip + 1], language, LIMIT) == expected(model, language, LIMIT, clip)


@pytest.mark.parametrize("sample_len", [1, 9])
def test_a_batch_stops_at_the_sample_length(model, mels, expected, sample_len):
    """1: the SOT sequence's pass alone draws the first token."""
    tokens = GreedyDecoder(model, max_rows=4).decode(mels, "en", sample_len)
    assert tokens == expected(model, "en", sample_len)
    assert max(len(row) for row in tokens) == sample_len


@pytest.mark.parametrize("likelihood", [0.5, 0.6])
def test_a_row_that_ends_draws_nothing_more_and_a_batch_stops_when_every_row_has_ended(
    model, mels, expected, likelihood
):
    ending = end_made_likelier(model, expected(model, "en", LIMIT), likelihood)
    tokens = GreedyDecoder(ending, max_rows=4).decode(mels, "en", LIMIT)
    assert tokens == expected(ending, "en", LIMIT)
    assert min(len(row) for row in tokens) < LIMIT


def test_told_each_clips_length_a_decoder_ends_it_there_after_the_tokens_it_drew_without(model, mels, expected):
    """For random weights, which never end a clip of their own accord (the benchmarks' stand-in): lengths
    cut what the model draws, across two passes of two rows, and a length past the limit changes nothing."""
    decoder = GreedyDecoder(model, max_rows=2, ends_by_length=True)
    lengths = [3, 1, LIMIT + 5]
    tokens = decoder.decode(mels, "en", LIMIT, lengths)
    drawn = expected(model, "en", LIMIT)
    assert tokens == [row[:length] for row, length in zip(drawn, lengths, strict=True)]
    assert [len(row) for row in tokens] == [3, 1, LIMIT]


def test_a_decoder_that_can_end_clips_by_length_draws_what_whisper_decode_draws_without_lengths(model, mels, expected):
    decoder = GreedyDecoder(model, max_rows=4, ends_by_length=True)
    decoder.decode(mels, "en", LIMIT, [1, 1, 1])
    assert decoder.decode(mels, "en", LIMIT) == expected(model, "en", LIMIT)


def test_only_a_decoder_made_to_end_clips_by_length_is_told_their_lengths(model, mels):
    with pytest.raises(ValueError, match="lengths"):
        GreedyDecoder(model, max_rows=4).decode(mels, "en", LIMIT, [1, 1, 1])


def test_a_decode_stops_where_whisper_decode_does_when_the_tokens_would_outgrow_the_text_context(model, mels, expected):
    """As many tokens as fit in the text context after the four of the SOT sequence, and one."""
    short = short_context(model, 24)
    tokens = GreedyDecoder(short, max_rows=4).decode(mels, "en", 100)
    assert tokens == expected(short, "en", 100)
    assert max(len(row) for row in tokens) == 24 - 4 + 1


def test_a_batch_over_the_most_rows_is_decoded_in_passes_in_buffers_of_the_most_rows(model, mels, expected):
    assert GreedyDecoder(model, max_rows=2).decode(mels, "zh", LIMIT) == expected(model, "zh", LIMIT)
    assert GreedyDecoder(model, max_rows=2).buffer_bytes == 2 * GreedyDecoder(model, max_rows=1).buffer_bytes


def test_the_tokens_suppressed_always_and_at_the_first_token_are_whisper_decodes(model):
    options = whisper.DecodingOptions(language="zh", without_timestamps=True)
    tokenizer = get_tokenizer(True, num_languages=model.num_languages, language="zh", task="transcribe")
    assert suppressed_tokens(tokenizer) == list(DecodingTask(model, options)._get_suppress_tokens())
    logits = torch.zeros(1, model.dims.n_vocab)
    prompt = torch.tensor([tokenizer.sot_sequence_including_notimestamps])
    SuppressBlank(tokenizer, sample_begin=prompt.shape[1]).apply(logits, prompt)
    assert torch.isinf(logits[0]).nonzero().flatten().tolist() == sorted(blank_tokens(tokenizer))


def test_a_pass_runs_the_next_power_of_two_of_rows_up_to_8_then_the_next_multiple_of_8_at_most_the_most(model):
    assert GreedyDecoder(model, max_rows=60).row_buckets == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 60]
    assert GreedyDecoder(model, max_rows=3).row_buckets == [1, 2, 3]
    assert GreedyDecoder(model, max_rows=1).row_buckets == [1]


def test_the_compiled_encoder_gives_whisper_s_features_for_any_count_of_clips_from_one_compilation(model, sounds):
    """What the decoder encodes with on CUDA, compiled here for the CPU: Whisper's features of one clip, two
    and three, from the one graph compiled when it was made (a compilation in a farm's workload would stall
    its listener for seconds)."""
    encoder = CompiledEncoder(model, torch.float32)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for clips in (1, 2, 3):
            torch.testing.assert_close(encoder(sounds[:clips]), model.encoder(sounds[:clips]), rtol=1e-4, atol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_the_sounds_the_gpu_test_decodes_are_heard_apart_and_as_whisper_decode_hears_them(model, sounds):
    tokens = GreedyDecoder(model, max_rows=4).decode(sounds, "en", LIMIT)
    assert tokens == whisper_tokens(model, sounds, "en", LIMIT)
    assert len({tuple(row) for row in tokens}) == len(sounds)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU, and there is none here")
@pytest.mark.parametrize("variant", ["hearing", "ending early", "short context"])
def test_on_cuda_the_graphs_draw_the_tokens_the_steps_draw_op_by_op(model, sounds, variant):
    """On a GPU only (skipped without CUDA): the decoder replaying its steps as CUDA graphs draws what the
    same steps draw op by op, on batches of three (a row of padding in a pass of four) and five (passes of
    four and one); limits of 21 tokens (not a whole number of graphs), rows ending early, and a text
    context whose last steps do not fill a graph (they run op by op); and clips ended by their lengths."""
    chosen = {
        "hearing": lambda: model,
        "ending early": lambda: end_made_likelier(model, GreedyDecoder(model, 4).decode(sounds, "en", LIMIT), 0.5),
        "short context": lambda: short_context(model, 32),
    }[variant]()
    on_gpu = copy.deepcopy(chosen).cuda()
    # In fp32. In fp16 (the gate's dtype) on an H200 the graphs and the steps op by op drew the same 24
    # tokens of a clip, three whole graphs, and parted at the 25th (2026-12-03, twice, in two of the three
    # variants each time, not the same two): most likely random weights' logits all but tied there, where
    # two kernels that round apart pick either. A real difference in what the steps compute shows in fp32 too.
    graphed = GreedyDecoder(on_gpu, max_rows=4, dtype=torch.float32, ends_by_length=True)
    eager = GreedyDecoder(on_gpu, max_rows=4, eager=True, dtype=torch.float32, ends_by_length=True)
    for batch in (sounds.cuda(), torch.cat([sounds, sounds[:2]]).cuda()):
        for language in ("en", "zh"):
            for sample_len in (21, 100):
                assert graphed.decode(batch, language, sample_len) == eager.decode(batch, language, sample_len)
        lengths = [2, 30, 11, 9, 17][: len(batch)]
        ended = graphed.decode(batch, "en", 100, lengths)
        assert ended == eager.decode(batch, "en", 100, lengths)
        assert all(len(row) <= length for row, length in zip(ended, lengths, strict=True))
