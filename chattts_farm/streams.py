"""A streaming job's audio in Redis as it is made: the stream's format, the writer, and the reader.

A job submitted with ``stream=True`` (the task's kwarg, or ``"stream": true`` on ``POST /api/jobs``)
has a Redis stream, ``chattts:stream:<job id>`` (:func:`chattts_farm.redis_keys.stream`). Its worker
appends entries in order; every field is text except ``pcm``:

- ``type=audio``: ``seq`` (0, 1, 2, ...), ``segment`` (which segment of the text it belongs to),
  ``sample_rate``, ``pcm``: little-endian signed 16-bit mono samples. The ``pcm`` of all audio
  entries joined in order is the job's whole audio as 16-bit samples, pauses between segments
  included: the same samples as its stored WAV.
- ``type=end``: ``seq``, ``summary``: the job's result as JSON, as ``chattts.synthesize`` returns it.
- ``type=error``: ``seq``, ``error`` (the name of the :class:`~chattts_farm.contract.FarmError`
  subclass), ``message``, and ``field`` for an ``InvalidRequest``.

Every write refreshes the stream's expiry (``CHATTTS_FARM_STREAM_TTL_S``) and trims it to about
``CHATTTS_FARM_STREAM_MAX_ENTRIES`` entries. The whole audio is stored as for any job, so a caller
that never reads the stream loses nothing. With only the ``redis`` package, read it with ``XREAD``
from id ``0`` (correct whether the job is queued, running or done), or use :func:`stream_audio`.

Torch-free and Celery-free: only ``redis`` (and only when called).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from chattts_farm import contract, redis_keys

AUDIO, END, ERROR = "audio", "end", "error"


@dataclass(frozen=True)
class AudioChunk:
    seq: int
    segment: int
    sample_rate: int
    pcm: bytes = field(repr=False)


@dataclass(frozen=True)
class StreamEnd:
    seq: int
    summary: dict


@dataclass(frozen=True)
class StreamFailed:
    seq: int
    error: str
    message: str
    field: str = ""

    @classmethod
    def of(cls, seq: int, error: contract.FarmError) -> StreamFailed:
        if isinstance(error, contract.InvalidRequest):
            return cls(seq, type(error).__name__, error.message, error.field)
        return cls(seq, type(error).__name__, str(error))

    def exception(self) -> contract.FarmError:
        """The error as the farm's own type (FarmError itself for a name this version does not know)."""
        if self.error == contract.InvalidRequest.__name__:
            return contract.InvalidRequest(self.field, self.message)
        kind = _ERRORS.get(self.error, contract.FarmError)
        return kind(self.message)


StreamEntry = AudioChunk | StreamEnd | StreamFailed

_ERRORS = {
    kind.__name__: kind
    for kind in (contract.ModelUnavailable, contract.JobCancelled, contract.JobTimeout, contract.SynthesisFailed)
}


def encode(entry: StreamEntry) -> dict[str, str | bytes]:
    """An entry as the fields of one XADD."""
    if isinstance(entry, AudioChunk):
        return {
            "type": AUDIO,
            "seq": str(entry.seq),
            "segment": str(entry.segment),
            "sample_rate": str(entry.sample_rate),
            "pcm": entry.pcm,
        }
    if isinstance(entry, StreamEnd):
        return {"type": END, "seq": str(entry.seq), "summary": json.dumps(entry.summary)}
    return {"type": ERROR, "seq": str(entry.seq), "error": entry.error, "message": entry.message, "field": entry.field}


def decode(fields: dict[bytes, bytes]) -> StreamEntry:
    """An entry from the fields XREAD gives (bytes, as a client without ``decode_responses`` has them)."""
    kind = fields[b"type"].decode()
    seq = int(fields[b"seq"])
    if kind == AUDIO:
        return AudioChunk(seq, int(fields[b"segment"]), int(fields[b"sample_rate"]), fields[b"pcm"])
    if kind == END:
        return StreamEnd(seq, json.loads(fields[b"summary"]))
    if kind == ERROR:
        return StreamFailed(seq, fields[b"error"].decode(), fields[b"message"].decode(), fields[b"field"].decode())
    raise ValueError(f"unknown stream entry type {kind!r}")


def append(client: Any, job_id: str, entries: Iterable[StreamEntry], *, ttl_s: int, max_entries: int) -> None:
    """Append entries to a job's stream and refresh its expiry; ``client`` may be a pipeline (nothing
    is sent until it executes)."""
    key = redis_keys.stream(job_id)
    for entry in entries:
        client.xadd(key, encode(entry), maxlen=max_entries, approximate=True)
    client.expire(key, ttl_s)


def read(
    client: Any, job_id: str, *, after: bytes | str = b"0", block_ms: int = 1000
) -> list[tuple[bytes, StreamEntry]]:
    """The entries after id ``after`` (``0``: from the start), waiting up to ``block_ms`` for the first;
    each with its stream id, to read on from."""
    answer = client.xread({redis_keys.stream(job_id): after}, block=block_ms)
    if not answer:
        return []
    [(_, entries)] = answer
    return [(entry_id, decode(fields)) for entry_id, fields in entries]


class AudioStream:
    """Iterates over a streaming job's audio chunks in order; ``summary`` is the job's result once the
    stream has ended. An error entry raises the farm's typed error; no entry for ``timeout_s`` raises
    :class:`TimeoutError`."""

    def __init__(self, client: Any, job_id: str, *, timeout_s: float, block_ms: int):
        self.client = client
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.block_ms = block_ms
        self.summary: dict | None = None

    def __iter__(self) -> Iterator[AudioChunk]:
        after: bytes | str = b"0"
        last_heard = time.monotonic()
        while True:
            entries = read(self.client, self.job_id, after=after, block_ms=self.block_ms)
            if not entries:
                if time.monotonic() - last_heard > self.timeout_s:
                    raise TimeoutError(f"no audio from job {self.job_id} for {self.timeout_s:g} s")
                continue
            last_heard = time.monotonic()
            for entry_id, entry in entries:
                after = entry_id
                if isinstance(entry, AudioChunk):
                    yield entry
                elif isinstance(entry, StreamEnd):
                    self.summary = entry.summary
                    return
                else:
                    raise entry.exception()


def stream_audio(
    job_id: str, *, client: Any = None, redis_url: str | None = None, timeout_s: float = 600.0, block_ms: int = 1000
) -> AudioStream:
    """A streaming job's audio chunks, in order, as they are made::

    chunks = stream_audio(job_id, redis_url="redis://localhost:6379/0")
    for chunk in chunks:
        speaker.write(chunk.pcm)  # 16-bit mono at chunk.sample_rate
    print(chunks.summary["duration_s"])
    """
    if client is None:
        import redis

        client = redis.Redis.from_url(redis_url or "redis://localhost:6379/0")
    return AudioStream(client, job_id, timeout_s=timeout_s, block_ms=block_ms)
