"""Encoding synthesised audio into the formats the farm serves: the compressed ones with libsndfile (via
soundfile), WAV and streamed 16-bit samples here, in the bytes libsndfile would write."""

from __future__ import annotations

import io
import wave

import numpy as np
import soundfile

from chattts_farm.contract import MIME_TYPES

# ChatTTS's vocoder speaks at 24 kHz.
SAMPLE_RATE = 24_000

# (libsndfile container, codec) per compressed format. Ogg carries Opus: the smallest files at speech
# quality. WAV is written by wav().
_CODECS = {
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "OPUS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
}
assert set(_CODECS) | {"wav"} == set(MIME_TYPES), "every contract format needs an encoder"


def encode(samples: np.ndarray, sample_rate: int, audio_format: str) -> bytes:
    """Encode mono float samples in [-1, 1] (anything beyond is clipped) into ``audio_format``."""
    if audio_format == "wav":
        return wav(samples, sample_rate)
    container, codec = _CODECS[audio_format]
    buffer = io.BytesIO()
    soundfile.write(buffer, _clipped(samples), sample_rate, format=container, subtype=codec)
    return buffer.getvalue()


def pcm16(samples: np.ndarray) -> bytes:
    """Raw little-endian 16-bit samples: libsndfile's own conversion of clipped float samples, bit for
    bit (scaled by 2**31, rounded to the nearest, shifted down 16 bits), without its per-call cost
    (a file object and Python callbacks: ~6x the time here, under the interpreter's lock), since a
    worker converts every streamed piece and every WAV result."""
    scaled = _clipped(samples)
    scaled *= np.float32(2.0**31)
    np.rint(scaled, out=scaled)
    scaled /= np.float32(2.0**16)
    np.floor(scaled, out=scaled)
    np.clip(scaled, -32768, 32767, out=scaled)
    return scaled.astype("<i2").tobytes()


def wav(samples: np.ndarray, sample_rate: int) -> bytes:
    """A 16-bit mono WAV: the bytes libsndfile writes for it, header and samples."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(sample_rate)
        file.writeframes(pcm16(samples))
    return buffer.getvalue()


def _clipped(samples: np.ndarray) -> np.ndarray:
    """A float32 copy of ``samples`` in [-1, 1] (infinities at the ends), NaN as silence.

    Not ``np.nan_to_num``: it looks for each kind of non-finite value in a pass of its own and took
    nine tenths of the conversion's time (py-spy on an H200 host's Celery processes)."""
    clipped = samples.astype(np.float32)
    np.clip(clipped, -1.0, 1.0, out=clipped)
    np.copyto(clipped, 0.0, where=np.isnan(clipped))
    return clipped


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Decode any format :func:`encode` writes back to mono float32 samples and their rate."""
    samples, sample_rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=False)
    return samples, sample_rate
