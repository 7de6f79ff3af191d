"""Every served format is encoded by a real encoder and decodes back to the same duration."""

import numpy as np
import pytest

from chattts_farm.contract import FORMATS, MIME_TYPES
from worker.audio import decode, encode

SAMPLE_RATE = 24_000
MAGIC = {"wav": b"RIFF", "flac": b"fLaC", "ogg": b"OggS"}


@pytest.mark.parametrize("audio_format", FORMATS)
def test_each_format_round_trips_with_its_duration(audio_format):
    seconds = np.arange(int(1.5 * SAMPLE_RATE)) / SAMPLE_RATE
    tone = (0.3 * np.sin(2 * np.pi * 220 * seconds)).astype(np.float32)
    data = encode(tone, SAMPLE_RATE, audio_format)
    samples, rate = decode(data)
    assert rate == SAMPLE_RATE
    assert abs(len(samples) / rate - 1.5) < 0.03
    assert np.abs(samples).max() > 0.2
    if audio_format in MAGIC:
        assert data.startswith(MAGIC[audio_format])


def test_mime_types_are_the_registered_ones():
    assert MIME_TYPES == {"wav": "audio/wav", "flac": "audio/flac", "ogg": "audio/ogg", "mp3": "audio/mpeg"}


def test_out_of_range_and_nan_samples_are_clipped_not_wrapped():
    samples = np.array([2.0, -3.0, np.nan, 0.5] * 1000, dtype=np.float32)
    decoded, _ = decode(encode(samples, SAMPLE_RATE, "wav"))
    assert decoded.max() <= 1.0 and decoded.min() >= -1.0
    assert decoded[0] > 0.99 and decoded[1] < -0.99 and decoded[2] == 0.0
