"""A reference clip, uploaded for a voice: checked and decoded into the samples the speaker-sample task takes.

The web decodes with libsndfile (``soundfile``, as it transcodes streams): WAV, FLAC, Ogg (Opus or
Vorbis) and MP3. Everything about a clip is bounded before it costs much: its size (MAX_CLIP_BYTES,
refused from the request's length before the body is read when the length is sent), then what its
header says (format, channels, rate, length), then the decoding itself, a second of audio a call off the
event loop (:func:`web.off_loop.off_loop`), never more than MAX_CLIP_S and a second. A header that
claims more audio than the file holds is refused, not trusted: libsndfile quietly shortens a WAV whose
data chunk overstates its size, so WAV headers are read here first. Every refusal names ``audio``.
"""

from __future__ import annotations

import base64
import struct
from typing import IO

import numpy as np
import soundfile

from chattts_farm.contract import CLIP_SAMPLE_RATE, MAX_CLIP_S, MIN_CLIP_S
from web.errors import ApiError
from web.off_loop import off_loop

MAX_CLIP_BYTES = 10_000_000
TOO_BIG = f"a clip is at most {MAX_CLIP_BYTES // 10**6} MB"
# libsndfile's names (soundfile's) of the containers a clip may come in.
CLIP_FORMATS = {"WAV", "WAVEX", "RF64", "FLAC", "OGG", "MP3"}
MAX_CHANNELS = 2
LOWEST_RATE, HIGHEST_RATE = 8_000, 192_000
# What a WAV's data chunk says when its writer did not know the length (a stream): to the end of the file.
_UNKNOWN_WAV_LENGTHS = {0, 0xFFFFFFFF}
# Decoded audio short of what the header says by more than this share (and a tenth of a second) is a lie.
# An MP3 has no length in a header of its own (only an estimate, or an encoder's Xing/LAME note): it is
# held to its decoded length alone.
_LENGTH_SLACK = 0.05


def refuse(message: str, status: int = 400) -> ApiError:
    return ApiError(status, f"audio: {message}", "audio")


def clip_samples(stream: IO[bytes]) -> str:
    """The clip in ``stream`` (a file the upload was spooled to) as the speaker-sample task takes it:
    base64 of 16-bit mono samples at 24 kHz. An :class:`ApiError` naming ``audio`` for any bad clip."""
    size = stream.seek(0, 2)
    if size > MAX_CLIP_BYTES:
        raise refuse(TOO_BIG, 413)
    if size == 0:
        raise refuse("the file is empty")
    stream.seek(0)
    _check_wav_header(stream.read(64 * 1024), size)
    stream.seek(0)
    try:
        decoder = off_loop(soundfile.SoundFile, stream)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as error:
        raise refuse(f"not a sound file in WAV, FLAC, Ogg or MP3 (libsndfile: {error})") from None
    try:
        samples, rate = _decoded(decoder)
    finally:
        off_loop(decoder.close)
    resampled = off_loop(resample, samples, rate, CLIP_SAMPLE_RATE)
    pcm = (np.clip(resampled, -1.0, 1.0) * 32767).round().astype("<i2")
    return base64.b64encode(pcm.tobytes()).decode("ascii")


def _decoded(decoder: soundfile.SoundFile) -> tuple[np.ndarray, int]:
    """The clip's samples (mono float32, its own rate), each bound checked as soon as it can be."""
    if decoder.format not in CLIP_FORMATS:
        raise refuse(f"a {decoder.format_info} file: a clip is WAV, FLAC, Ogg or MP3")
    if not 1 <= decoder.channels <= MAX_CHANNELS:
        raise refuse(f"has {decoder.channels} channels; a clip is mono or stereo")
    rate = decoder.samplerate
    if not LOWEST_RATE <= rate <= HIGHEST_RATE:
        raise refuse(f"is sampled at {rate} Hz; a clip is {LOWEST_RATE} to {HIGHEST_RATE} Hz")
    claimed_s = decoder.frames / rate
    if decoder.format != "MP3":
        _check_length(claimed_s, "the file's header says it lasts")
    most = int((MAX_CLIP_S + 1) * rate)
    blocks, frames = [], 0
    try:
        while frames <= most and (block := off_loop(decoder.read, rate, dtype="float32", always_2d=True)).size:
            blocks.append(block.mean(axis=1))
            frames += len(block)
    except (soundfile.LibsndfileError, RuntimeError) as error:
        raise refuse(f"could not be decoded after {frames / rate:.1f} s ({error})") from None
    decoded_s = frames / rate
    if decoder.format != "MP3" and decoded_s < claimed_s * (1 - _LENGTH_SLACK) - 0.1:
        raise refuse(f"the header says it lasts {claimed_s:.1f} s, but only {decoded_s:.1f} s of audio is there")
    _check_length(decoded_s, "it lasts")
    return (np.concatenate(blocks) if blocks else np.zeros(0, np.float32)), rate


def _check_length(seconds: float, what: str) -> None:
    if seconds > MAX_CLIP_S:
        raise refuse(f"{what} {seconds:.1f} s; a clip is at most {MAX_CLIP_S:g} s")
    if seconds < MIN_CLIP_S:
        raise refuse(f"{what} {seconds:.2f} s; a clip is at least {MIN_CLIP_S:g} s")


def _check_wav_header(head: bytes, size: int) -> None:
    """A RIFF WAV's data chunk must fit in the file: libsndfile would read what is there as the whole."""
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return
    position = 12
    while position + 8 <= len(head):
        chunk, length = head[position : position + 4], struct.unpack_from("<I", head, position + 4)[0]
        if chunk == b"data":
            present = size - position - 8
            if length > present and length not in _UNKNOWN_WAV_LENGTHS:
                raise refuse(f"the WAV header claims {length} bytes of samples, but the file holds {present}")
            return
        position += 8 + length + length % 2


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``samples`` at ``target`` Hz, by the Fourier method (the band above the lower rate's Nyquist
    frequency dropped, none added): exact for band-limited audio, and deterministic."""
    if rate == target or not samples.size:
        return samples.astype(np.float32)
    length = round(len(samples) * target / rate)
    spectrum = np.fft.rfft(samples.astype(np.float64))
    kept = min(len(spectrum), length // 2 + 1)
    return (np.fft.irfft(spectrum[:kept], n=length) * (length / len(samples))).astype(np.float32)
