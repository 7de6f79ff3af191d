"""Encoding synthesised audio into the formats the farm serves, with libsndfile (via soundfile)."""

from __future__ import annotations

import io

import numpy as np
import soundfile

from chattts_farm.contract import MIME_TYPES

# ChatTTS's vocoder speaks at 24 kHz.
SAMPLE_RATE = 24_000

# (libsndfile container, codec) per format. Ogg carries Opus: the smallest files at speech quality.
_CODECS = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "OPUS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
}
assert set(_CODECS) == set(MIME_TYPES), "every contract format needs an encoder"
# Streamed chunks: headerless samples, as in the WAV.
_CODECS["pcm"] = ("RAW", "PCM_16")


def encode(samples: np.ndarray, sample_rate: int, audio_format: str) -> bytes:
    """Encode mono float samples in [-1, 1] (anything beyond is clipped) into ``audio_format``."""
    container, codec = _CODECS[audio_format]
    buffer = io.BytesIO()
    clipped = np.clip(np.nan_to_num(samples.astype(np.float32)), -1.0, 1.0)
    soundfile.write(buffer, clipped, sample_rate, format=container, subtype=codec)
    return buffer.getvalue()


def pcm16(samples: np.ndarray, sample_rate: int) -> bytes:
    """Raw little-endian 16-bit samples, converted exactly as :func:`encode` converts them for a WAV."""
    return encode(samples, sample_rate, "pcm")


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Decode any format :func:`encode` writes back to mono float32 samples and their rate."""
    samples, sample_rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=False)
    return samples, sample_rate
