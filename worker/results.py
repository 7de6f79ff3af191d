"""What a finished request gives back: its audio and its description, on either side of the engine process.

Torch-free: the engine process builds a :class:`SynthesisResult`, sends it over the channel as a plain
message (:meth:`SynthesisResult.as_message`: the samples' float32 bytes; a streamed request's result
carries none, its audio having gone out as it was drawn), and the worker's Celery side rebuilds it
(:meth:`SynthesisResult.from_message`) and has its audio joined and encoded, off the
engine's interpreter: in a pool of encoder processes for the formats that cost CPU (mp3 and Ogg Opus
take tens of milliseconds a job, which one interpreter's lock would serialise).
"""

from __future__ import annotations

import copy
import functools
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field, fields, replace

import numpy as np

from worker import audio
from worker.channel import float32_bytes

# Travel beside the summary, not in it.
_UNSAID = frozenset({"pieces", "silences"})
# Formats whose encoding costs less than handing the samples to another process.
CHEAP_FORMATS = frozenset({"wav"})


def joined(pieces: list[np.ndarray], silences: list[int]) -> np.ndarray:
    """The pieces as one float32 signal, ``silences[i]`` samples of silence before piece ``i`` and
    ``silences[-1]`` after the last: one copy at most (none for a single piece without silence around it).
    Non-finite samples stay as they are: encoding clips them (see worker.audio), and looking for them
    here cost a worker's Celery process 7.7% of its time on an H200 host (py-spy)."""
    if len(pieces) == 1 and not any(silences):
        return pieces[0].astype(np.float32, copy=False)
    signal = np.zeros(sum(piece.size for piece in pieces) + sum(silences), dtype=np.float32)
    start = 0
    for piece, silence in zip(pieces, silences[:-1], strict=True):
        start += silence
        signal[start : start + piece.size] = piece
        start += piece.size
    return signal


def timeline(sizes: list[int], silences: list[int], sample_rate: int, captions: list[str]) -> list[dict]:
    """Where each segment lies in the audio :func:`joined` makes of pieces of ``sizes`` samples, counted in
    its samples: one entry a segment, ``{"index", "text", "start_s", "end_s"}`` (``text``: its caption), to
    the millisecond."""
    entries, end = [], 0
    for index, (size, silence, caption) in enumerate(zip(sizes, silences[:-1], captions, strict=True)):
        start = end + silence
        end = start + size
        entries.append(
            {
                "index": index,
                "text": caption,
                "start_s": round(start / sample_rate, 3),
                "end_s": round(end / sample_rate, 3),
            }
        )
    return entries


def encode_joined(pieces: list[np.ndarray], silences: list[int], sample_rate: int, audio_format: str) -> bytes:
    """Join and encode: what a process of the encoder pool runs (a module-level function, to be sent there)."""
    return audio.encode(joined(pieces, silences), sample_rate, audio_format)


@dataclass
class SynthesisResult:
    """One request's audio and its description. The segments' audio is joined when ``samples`` is first
    read and encoded when ``audio`` is, by whoever reads them: a worker's job thread, not the engine."""

    request_id: str
    # The segments' samples, float32 at sample_rate. None where the engine process streamed them: they
    # went out as they were drawn, and the worker's Celery side puts together what it received
    # (:meth:`with_streamed_audio`).
    pieces: list[np.ndarray] | None = field(repr=False)
    # Samples of silence before each segment, and after the last (one more than pieces): the pause
    # between segments, or what an SSML <break> asked for.
    silences: list[int] = field(repr=False)
    format: str
    mime_type: str
    sample_rate: int
    duration_s: float
    tokens: int
    segments: int
    seed: int  # the audio seed used: passing it again reproduces this audio
    voice_embedding: str | None = field(repr=False)  # None for a voice from a reference clip
    batch_size: int
    timings: dict[str, float]
    quality: dict
    model: dict
    memory: dict
    timeline: list[dict]  # each segment's place in the audio (see timeline())

    @functools.cached_property
    def samples(self) -> np.ndarray:
        return joined(self.pieces, self.silences)

    @functools.cached_property
    def audio(self) -> bytes:
        started = time.perf_counter()
        encoded = audio.encode(self.samples, self.sample_rate, self.format)
        self.timings["encode_s"] = round(time.perf_counter() - started, 4)
        return encoded

    def summary(self) -> dict:
        """Everything but the audio, JSON-able (encode_s is there once the audio has been read)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in _UNSAID}

    def as_message(self) -> dict:
        """The result as plain values for the channel, its samples as blobs (see worker.channel)."""
        return {
            "summary": self.summary(),
            "pieces": None if self.pieces is None else [float32_bytes(piece) for piece in self.pieces],
            "silences": self.silences,
        }

    def with_streamed_audio(self, streamed: list[np.ndarray]) -> SynthesisResult:
        """A streamed result with its audio: every chunk that came as it was drawn, in order (silences and
        all, so the result's own silences are in it already)."""
        assert self.pieces is None, "the result carries its audio"
        whole = np.concatenate(streamed) if streamed else np.zeros(0, dtype=np.float32)
        return replace(self, pieces=[whole], silences=[0, 0])

    def encoded_by(self, pool: Executor | None) -> bytes:
        """The audio, encoded by a process of ``pool`` (another interpreter: many jobs' encodings at once)
        where its format costs CPU, else here."""
        if pool is None or self.format in CHEAP_FORMATS:
            return self.audio
        started = time.perf_counter()
        encoded = pool.submit(encode_joined, self.pieces, self.silences, self.sample_rate, self.format).result()
        self.timings["encode_s"] = round(time.perf_counter() - started, 4)
        return encoded

    @classmethod
    def from_message(cls, message: dict) -> SynthesisResult:
        pieces = message["pieces"]
        if pieces is not None:
            pieces = [np.frombuffer(piece, dtype=np.float32) for piece in pieces]
        return cls(pieces=pieces, silences=message["silences"], **message["summary"])
