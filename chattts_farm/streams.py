"""A streaming job's audio in Redis as it is made: the stream's format, the writer, and the reader.

A job submitted with ``stream=True`` (the task's kwarg, or ``"stream": true`` on ``POST /api/jobs``)
has a Redis stream, ``chattts:stream:<job id>`` (:func:`chattts_farm.redis_keys.stream`). Its worker
appends entries in order; every field is text except ``pcm``. Every entry has ``seq`` (0, 1, 2, ...
within its run) and ``run``: the id of the task's run that wrote it. A job whose worker died is run again
from its start by another worker; the new run deletes the stream and writes it anew, so a reader that
finds another run's entries (or a gap in ``seq``) while it reads knows its audio restarted, and one that
starts reading then reads only the new run:

- ``type=audio``: ``segment`` (which segment of the text it belongs to),
  ``sample_rate``, ``pcm``: little-endian signed 16-bit mono samples. The ``pcm`` of all audio
  entries joined in order is the job's whole audio as 16-bit samples, silences included (the pauses
  between segments, an SSML break's before, between or after them): the same samples as its stored WAV.
- ``type=end``: ``summary``: the job's result as JSON, as ``chattts.synthesize`` returns it.
- ``type=error``: ``error`` (the name of the :class:`~chattts_farm.contract.FarmError`
  subclass), ``message``, and ``field`` for an ``InvalidRequest``.

Every write refreshes the stream's expiry (``CHATTTS_FARM_STREAM_TTL_S``) and trims it to about
``CHATTTS_FARM_STREAM_MAX_ENTRIES`` entries. The whole audio is stored as for any job, so a caller
that never reads the stream loses nothing. With only the ``redis`` package, read it with ``XREAD``
from id ``0`` (correct whether the job is queued, running or done), or use :func:`stream_audio`.
Nothing of a job's audio is in its stream after the last entry: no end entry means it is not over, or
(its stream expired, its worker lost) never will be.

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


class StreamInterrupted(Exception):
    """The stream being read lost its thread: the job's worker was lost and the job runs again from its
    start, or entries were trimmed before they were read. Read it again from the start, or fetch the
    job's audio once it is done."""


@dataclass(frozen=True)
class AudioChunk:
    seq: int
    segment: int
    sample_rate: int
    pcm: bytes = field(repr=False)
    run: str = ""

    @property
    def seconds(self) -> float:
        return len(self.pcm) / (2 * self.sample_rate)


@dataclass(frozen=True)
class StreamEnd:
    seq: int
    summary: dict
    run: str = ""


@dataclass(frozen=True)
class StreamFailed:
    seq: int
    error: str
    message: str
    field: str = ""
    run: str = ""

    @classmethod
    def of(cls, seq: int, error: contract.FarmError, run: str = "") -> StreamFailed:
        if isinstance(error, contract.InvalidRequest):
            return cls(seq, type(error).__name__, error.message, error.field, run)
        return cls(seq, type(error).__name__, str(error), run=run)

    def exception(self) -> contract.FarmError:
        """The error as the farm's own type (FarmError itself for a name this version does not know)."""
        if self.error == contract.InvalidRequest.__name__:
            return contract.InvalidRequest(self.field, self.message)
        kind = _ERRORS.get(self.error, contract.FarmError)
        return kind(self.message)


StreamEntry = AudioChunk | StreamEnd | StreamFailed

_ERRORS = {
    kind.__name__: kind
    for kind in (
        contract.ModelUnavailable,
        contract.JobCancelled,
        contract.JobTimeout,
        contract.SynthesisFailed,
        contract.EngineLost,
    )
}


def encode(entry: StreamEntry) -> dict[str, str | bytes]:
    """An entry as the fields of one XADD."""
    common = {"seq": str(entry.seq), "run": entry.run}
    if isinstance(entry, AudioChunk):
        return {
            "type": AUDIO,
            **common,
            "segment": str(entry.segment),
            "sample_rate": str(entry.sample_rate),
            "pcm": entry.pcm,
        }
    if isinstance(entry, StreamEnd):
        return {"type": END, **common, "summary": json.dumps(entry.summary)}
    return {"type": ERROR, **common, "error": entry.error, "message": entry.message, "field": entry.field}


def decode(fields: dict[bytes, bytes]) -> StreamEntry:
    """An entry from the fields XREAD gives (bytes, as a client without ``decode_responses`` has them)."""
    kind = fields[b"type"].decode()
    seq = int(fields[b"seq"])
    run = fields.get(b"run", b"").decode()  # written by workers of every version since runs were named
    if kind == AUDIO:
        return AudioChunk(seq, int(fields[b"segment"]), int(fields[b"sample_rate"]), fields[b"pcm"], run)
    if kind == END:
        return StreamEnd(seq, json.loads(fields[b"summary"]), run)
    if kind == ERROR:
        error, message, field_name = (fields[name].decode() for name in (b"error", b"message", b"field"))
        return StreamFailed(seq, error, message, field_name, run)
    raise ValueError(f"unknown stream entry type {kind!r}")


def append(client: Any, job_id: str, entries: Iterable[StreamEntry], *, ttl_s: int, max_entries: int) -> None:
    """Append entries to a job's stream and refresh its expiry; ``client`` may be a pipeline (nothing
    is sent until it executes)."""
    key = redis_keys.stream(job_id)
    for entry in entries:
        client.xadd(key, encode(entry), maxlen=max_entries, approximate=True)
    client.expire(key, ttl_s)


def restart(client: Any, job_id: str) -> None:
    """Empty a job's stream for a new run of its job; ``client`` may be a pipeline.

    Trimmed, not deleted: a stream made anew numbers its entries from the clock, so the new run's first
    entry, written in the same millisecond as the old run's last, could sort before a reader's place and
    never reach it. An emptied stream keeps its last id, and every new entry comes after it."""
    client.xtrim(redis_keys.stream(job_id), maxlen=0, approximate=False)


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


class Continuity:
    """Follows one run of a stream, entry by entry: the first entry read names the run, and every later
    one must be of that run, next in ``seq``."""

    def __init__(self):
        self.run: str | None = None
        self.next_seq = 0

    def follows(self, entry: StreamEntry) -> bool:
        """Whether ``entry`` continues what was read before it (a first entry must be its run's first)."""
        if (entry.run if self.run is None else self.run) != entry.run or entry.seq != self.next_seq:
            return False
        self.run, self.next_seq = entry.run, entry.seq + 1
        return True


class AudioStream:
    """Iterates over a streaming job's audio chunks in order; ``summary`` is the job's result once the
    stream has ended. An error entry raises the farm's typed error; a restarted or trimmed stream raises
    :class:`StreamInterrupted`; no entry for ``timeout_s`` raises :class:`TimeoutError`. ``last_id`` is
    the Redis stream id of the last entry read (its first part: the milliseconds of Redis's clock when
    the worker appended it)."""

    def __init__(self, client: Any, job_id: str, *, timeout_s: float, block_ms: int):
        self.client = client
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.block_ms = block_ms
        self.summary: dict | None = None
        self.last_id: bytes | None = None

    def __iter__(self) -> Iterator[AudioChunk]:
        after: bytes | str = b"0"
        last_heard = time.monotonic()
        continuity = Continuity()
        while True:
            entries = read(self.client, self.job_id, after=after, block_ms=self.block_ms)
            if not entries:
                if time.monotonic() - last_heard > self.timeout_s:
                    raise TimeoutError(f"no audio from job {self.job_id} for {self.timeout_s:g} s")
                continue
            last_heard = time.monotonic()
            for entry_id, entry in entries:
                after = self.last_id = entry_id
                if not continuity.follows(entry):
                    raise StreamInterrupted(
                        f"the stream of job {self.job_id} restarted (its worker was lost and it runs again) or"
                        " lost entries: read it again from the start, or fetch its audio once it is done"
                    )
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
