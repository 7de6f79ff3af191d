"""A job's audio as it is made, for ``GET /api/jobs/<id>/stream`` and the streaming ``/v1/audio/speech``.

A job submitted with ``stream`` has its chunks in its Redis stream (see :mod:`chattts_farm.streams`):
they are sent on as they arrive, whether the job is queued, running or done. A job without one (or
whose stream has expired) is served whole once it is done. Either way the answer is 16-bit PCM at the
job's sample rate, which the web encodes into the format asked for as it comes
(:mod:`web.audio_formats`).

Nothing is sent until the first audio (or the job's end) is there, so a job that fails first gets an
ordinary JSON error; one that fails once audio has gone out ends the response early (the job's own
status says why). Under gevent a waiting response is a parked greenlet holding no database connection
and a Redis connection only while one read blocks; a client that hangs up ends it within a second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from celery import states
from flask import request

from chattts_farm import streams
from chattts_farm.audio_store import StoredAudio
from web import audio_formats, backends, jobs
from web.errors import ApiError
from web.models import Job, JobStatus, db
from web.waiting import CLIENT_CLOSED, hung_up, job_watcher

logger = logging.getLogger(__name__)

# A stream read blocks at most this long, so a client that hung up is noticed within it.
READ_BLOCK_S = 1.0
# Past this long without a chunk (a job queued behind many), the response gives up; the job goes on.
IDLE_TIMEOUT_S = 600


@dataclass
class JobAudio:
    """A job's audio on its way to the client: the first piece (read before any byte is sent) and the rest."""

    job_id: str
    sample_rate: int
    first: bytes
    rest: Iterator[bytes]
    summary: dict | None = None  # the job's result, once its audio has all gone out

    def pcm(self) -> Iterator[bytes]:
        yield self.first
        yield from self.rest


def open_audio(job: Job, *, failed_status: int) -> JobAudio:
    """The job's audio as PCM chunks, from its stream or, once done, whole; ``failed_status`` when it
    fails or is cancelled before any audio."""
    connection = request.environ.get("gunicorn.socket")
    jobs.refresh(job)
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        raise ApiError(failed_status, f"job {job.id} {job.status}: {job.error}")
    job_id, streaming = job.id, bool(job.parameters.get("stream"))
    db.session.close()  # no database connection is held while the response waits
    client, results = backends.current().redis, backends.current().celery.backend
    if streaming:
        entries = _stream_entries(client, results, job_id, connection)
        for entry in entries:
            if isinstance(entry, streams.AudioChunk):
                audio = JobAudio(job_id, entry.sample_rate, entry.pcm, iter(()))
                audio.rest = _pcm_of(entries, audio)
                return audio
            if isinstance(entry, streams.StreamEnd):  # a job without a sound: nothing but its end
                return JobAudio(job_id, entry.summary["sample_rate"], b"", iter(()), entry.summary)
            raise ApiError(failed_status, f"job {job_id} failed: {entry.exception()}")
    # No stream (any more): the job was not submitted with one, or it ended without one, or it expired.
    return _whole(job_id, connection, failed_status)


def encoded(audio: JobAudio, audio_format: str) -> Iterator[bytes]:
    """The job's audio in ``audio_format`` (see :mod:`web.audio_formats`), encoded as its samples come."""
    encoding = audio_formats.encoder(audio_format, audio.sample_rate)
    try:
        for pcm in audio.pcm():
            data = encoding.encode(pcm)
            if data:
                yield data
        tail = encoding.finish()
        if tail:
            yield tail
    finally:
        encoding.close()


def _stream_entries(client, results, job_id: str, connection) -> Iterator[streams.StreamEntry]:
    """The stream's entries as they come; it stops early when the job has finished without a stream
    (revoked before it ran, or its stream expired)."""
    after: bytes = b"0"
    last_heard = time.monotonic()
    while True:
        left_s = IDLE_TIMEOUT_S - (time.monotonic() - last_heard)
        # XREAD's BLOCK 0 would wait forever: at least a millisecond.
        entries = streams.read(client, job_id, after=after, block_ms=max(1, int(min(READ_BLOCK_S, left_s) * 1000)))
        if not entries:
            if hung_up(connection):
                logger.info("job %s: the client hung up its stream; the job goes on", job_id)
                raise ApiError(CLIENT_CLOSED, f"the client hung up; job {job_id} goes on")
            if time.monotonic() - last_heard >= IDLE_TIMEOUT_S:
                raise ApiError(504, f"no audio from job {job_id} for {IDLE_TIMEOUT_S} s; it goes on")
            if results.get_task_meta(job_id)["status"] in states.READY_STATES:
                # Its last entries are written before its state: one more look, then it has none.
                for entry_id, entry in streams.read(client, job_id, after=after, block_ms=1):
                    after = entry_id
                    yield entry
                return
            continue
        last_heard = time.monotonic()
        for entry_id, entry in entries:
            after = entry_id
            yield entry


def _pcm_of(entries: Iterator[streams.StreamEntry], audio: JobAudio) -> Iterator[bytes]:
    try:
        for entry in entries:
            if isinstance(entry, streams.AudioChunk):
                yield entry.pcm
            elif isinstance(entry, streams.StreamEnd):
                audio.summary = entry.summary
                return
            else:
                logger.warning("job %s failed while it streamed: %s", audio.job_id, entry.exception())
                return
    except ApiError as stopped:  # hung up, or idle too long: the response ends
        logger.info("job %s: its stream ends early: %s", audio.job_id, stopped.message)


def _whole(job_id: str, connection, failed_status: int) -> JobAudio:
    """A job that does not stream: wait for it, then its stored audio as PCM."""
    watcher = job_watcher()
    finished = watcher.watch(job_id)
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    try:
        while not finished.wait(max(0.0, min(READ_BLOCK_S, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise ApiError(504, f"job {job_id} did not finish in {IDLE_TIMEOUT_S} s; it goes on")
            if hung_up(connection):
                raise ApiError(CLIENT_CLOSED, f"the client hung up; job {job_id} goes on")
    finally:
        watcher.forget(job_id, finished)
    job = jobs.refresh(db.session.get(Job, job_id))
    if job.status != JobStatus.DONE:
        raise ApiError(failed_status, f"job {job_id} {job.status}: {job.error}")
    stored = jobs.open_audio(job)
    try:
        pcm, sample_rate = audio_formats.pcm_of_pieces(job.format, stored.chunks())
        first = next(pcm, b"")
    except BaseException:
        stored.close()
        raise
    audio = JobAudio(job_id, sample_rate, first, _closing(pcm, stored), job.result)
    db.session.close()
    return audio


def _closing(pcm: Iterator[bytes], stored: StoredAudio) -> Iterator[bytes]:
    try:
        yield from pcm
    finally:
        stored.close()
