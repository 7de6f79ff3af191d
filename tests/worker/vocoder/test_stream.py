"""The vocoder beside the engine: pieces of what the engine drew come back decoded (and assessed), in order."""

import pytest
import torch

from worker.vocoder import quality
from worker.vocoder.piece import Piece
from worker.vocoder.stream import Decoder


@pytest.fixture
def finished_segments(tiny_settings, synthesizer, make_request):
    """Segments of two requests as the engine hands them over: with their output, not yet decoded."""
    from worker.engine_process.pipeline import Synthesizer

    core = Synthesizer(synthesizer.model, tiny_settings)
    entries = core.add([make_request("One short line."), make_request("A second, longer line of text to speak.")])
    segments = []
    while core.engine.has_work:
        segments.extend(core.engine.step())
    assert {segment.owner for segment in segments} == {entry.number for entry in entries}
    return segments


def collect_all(decoder):
    batches = []
    while decoder.pending:
        batches.extend(decoder.collect(wait=True))
    return batches


def test_whole_segments_handed_over_together_come_back_as_one_batch_equal_to_the_vocoder_alone(
    synthesizer, finished_segments
):
    decoder = Decoder(synthesizer.vocoder, torch.device("cpu"))
    pieces = [Piece.whole(segment) for segment in finished_segments]
    decoder.submit(pieces)
    (batch,) = collect_all(decoder)
    assert batch.error is None and batch.pieces == pieces and batch.seconds > 0
    expected = synthesizer.vocoder.decode([segment.output.hiddens for segment in finished_segments])
    for samples, alone, segment, assessed in zip(
        batch.samples, expected, finished_segments, batch.qualities, strict=True
    ):
        assert (samples == alone).all()
        output = segment.output
        assert assessed == quality.assess(alone, output.tokens, segment.expected_tokens, output.ended_by)
    assert decoder.pending == 0


def test_a_piece_of_a_row_decodes_its_kept_frames_as_the_whole_row_does(synthesizer, finished_segments):
    vocoder = synthesizer.vocoder
    segment = max(finished_segments, key=lambda s: s.output.hiddens.shape[0])
    hiddens, context, per_frame = segment.output.hiddens, vocoder.context_frames, vocoder.samples_per_frame
    keep_from, keep_to = context + 3, hiddens.shape[0] - context
    start, stop = keep_from - context, keep_to + context
    decoder = Decoder(vocoder, torch.device("cpu"))
    decoder.submit([Piece(segment, hiddens[start:stop], start, keep_from, keep_to, last=False, assess=False)])
    (batch,) = collect_all(decoder)
    whole = vocoder.decode([hiddens])[0]
    assert batch.qualities == [None]
    assert batch.samples[0].shape == ((keep_to - keep_from) * per_frame,)
    assert abs(batch.samples[0] - whole[keep_from * per_frame : keep_to * per_frame]).max() < 1e-4


def test_results_become_part_of_a_segment_only_when_the_engine_thread_takes_them(synthesizer, finished_segments):
    decoder = Decoder(synthesizer.vocoder, torch.device("cpu"))
    decoder.submit([Piece.whole(segment) for segment in finished_segments])
    collect_all(decoder)
    assert all(segment.samples is None and segment.quality is None for segment in finished_segments)


def test_a_launch_that_fails_raises_at_once_and_the_decoder_serves_the_next(synthesizer, finished_segments):
    class BrokenOnce:
        samples_per_frame = synthesizer.vocoder.samples_per_frame

        def __init__(self):
            self.calls = 0

        def launch(self, hiddens):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("vocoder crash")
            return synthesizer.vocoder.launch(hiddens)

    decoder = Decoder(BrokenOnce(), torch.device("cpu"))
    pieces = [Piece.whole(segment) for segment in finished_segments]
    with pytest.raises(RuntimeError, match="vocoder crash"):
        decoder.submit(pieces)
    assert decoder.pending == 0
    decoder.submit(pieces)
    (decoded,) = collect_all(decoder)
    assert decoded.error is None and len(decoded.samples) == len(finished_segments)


def test_batches_come_back_in_the_order_they_were_handed_over(synthesizer, finished_segments):
    decoder = Decoder(synthesizer.vocoder, torch.device("cpu"))
    first, second = [Piece.whole(finished_segments[0])], [Piece.whole(finished_segments[1])]
    decoder.submit(first)
    decoder.submit(second)
    assert decoder.pending == 2
    assert [batch.pieces for batch in decoder.collect()] == [first, second]
    assert decoder.collect(wait=True) == []  # nothing pending: returns at once
