"""Every served format is encoded by a real encoder and decodes back to the same duration."""

import io

import numpy as np
import pytest
import soundfile

from chattts_farm.contract import FORMATS, MIME_TYPES
from worker.audio import decode, encode, pcm16

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


def test_wav_and_streamed_samples_are_the_bytes_libsndfile_writes():
    # Converted here (libsndfile's per-call cost is a worker's for every streamed piece): the same
    # rounding at every value, the ends, NaN, infinities and the tiniest negative samples included.
    rng = np.random.default_rng(0)
    samples = np.concatenate(
        [
            rng.uniform(-1.2, 1.2, 200_000),
            rng.normal(0, 1e-6, 10_000),
            -np.abs(rng.normal(0, 1e-10, 1_000)),
            (np.arange(-32768, 32768) + 0.5) / 32768,
            [np.nan, np.inf, -np.inf, 1.0, -1.0, 0.0, -0.0, 1e-45, -1e-45],
        ]
    ).astype(np.float32)

    def by_libsndfile(container: str) -> bytes:
        buffer = io.BytesIO()
        clipped = np.clip(np.nan_to_num(samples), -1.0, 1.0)
        soundfile.write(buffer, clipped, SAMPLE_RATE, format=container, subtype="PCM_16")
        return buffer.getvalue()

    assert pcm16(samples) == by_libsndfile("RAW")
    assert encode(samples, SAMPLE_RATE, "wav") == by_libsndfile("WAV")
