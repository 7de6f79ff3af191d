"""The worker's side of a streamed job, played by a test: the test writes a queued job's stream with the
contract's own ``append`` (that the worker writes such streams while it synthesises is tested in
tests/worker)."""

import numpy as np
import redis

from chattts_farm.contract import FarmError
from chattts_farm.streams import AudioChunk, StreamEnd, StreamEntry, StreamFailed, append, restart

SAMPLE_RATE = 24_000


def samples(seconds: float, seed: int = 0) -> bytes:
    """Some 16-bit mono samples: a tone with noise, different for every seed."""
    count = int(seconds * SAMPLE_RATE)
    tone = np.sin(np.arange(count) * (0.05 + 0.01 * seed)) * 8000
    noise = np.random.default_rng(seed).normal(0, 500, count)
    return np.clip(tone + noise, -32768, 32767).astype("<i2").tobytes()


def pieces_of(pcm: bytes, count: int) -> list[bytes]:
    """``pcm`` cut into ``count`` pieces, each a whole number of samples."""
    bounds = [2 * (len(pcm) // 2 * index // count) for index in range(count + 1)]
    return [pcm[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


class StreamWriter:
    """Writes one job's stream as its worker would: audio pieces, in order, then its end or an error; a
    new run (the job run again after its worker was lost) starts it anew."""

    def __init__(self, client: redis.Redis, job_id: str, run: str = "first-run"):
        self.client, self.job_id, self.run = client, job_id, run
        self.seq = 0
        self.pcm = bytearray()

    def audio(self, *pieces: bytes, segment: int = 0) -> None:
        entries = [
            AudioChunk(self.seq + index, segment, SAMPLE_RATE, piece, self.run) for index, piece in enumerate(pieces)
        ]
        self._append(*entries)
        for piece in pieces:
            self.pcm += piece

    def failed(self, error: FarmError) -> None:
        self._append(StreamFailed.of(self.seq, error, self.run))

    def end(self, summary: dict) -> None:
        self._append(StreamEnd(self.seq, summary, self.run))

    def rerun(self, run: str) -> None:
        restart(self.client, self.job_id)
        self.run, self.seq, self.pcm = run, 0, bytearray()

    def _append(self, *entries: StreamEntry) -> None:
        append(self.client, self.job_id, entries, ttl_s=600, max_entries=4096)
        self.seq += len(entries)
