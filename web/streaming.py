"""A job's audio as it is made, for ``GET /api/jobs/<id>/stream`` and the streaming ``/v1/audio/speech``.

A job submitted with ``stream`` has its chunks in its Redis stream (see :mod:`chattts_farm.streams`):
they are sent on as they arrive, whether the job is queued, running or done, as 16-bit PCM at the job's
sample rate, which the web encodes into the format asked for as it comes (:mod:`web.audio_formats`,
in short turns of the event loop). A job without one (or whose stream has expired) is served whole once it is done:
as stored when it is stored in the format asked for, else decoded and encoded a piece at a time.

Nothing is sent until the first audio (or the job's end) is there, so a job that fails first gets an
ordinary JSON error; once audio has gone out, a response ends cleanly only with the job's whole audio:
a job that fails, is cancelled (:mod:`web.delivery`) or restarts on another worker cuts it off. Under
gevent a waiting response is a parked greenlet holding no database connection and a Redis connection
only while one read blocks; a client that hangs up ends it within a second.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from celery import states
from flask import request

from chattts_farm import streams
from chattts_farm.audio_store import StoredAudio
from web import audio_formats, backends, jobs
from web.delivery import Delivery
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
    fails or is cancelled before any audio. Once audio has gone out, an end short of the job's (it failed,
    was cancelled, restarted, or went quiet) raises :class:`StreamBroken` from the chunks."""
    connection = request.environ.get("gunicorn.socket")
    jobs.refresh(job)
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        raise ApiError(failed_status, f"job {job.id} {job.status}: {job.error}")
    job_id, streaming = job.id, bool(job.parameters.get("stream"))
    db.session.close()  # no database connection is held while the response waits
    if streaming:
        listener = _Listener(job_id, connection)
        try:
            first = listener.first_entry()
        except StreamBroken as stopped:
            raise ApiError(_STATUS_OF_STOP.get(stopped.code, failed_status), stopped.message) from None
        if isinstance(first, streams.AudioChunk):
            audio = JobAudio(job_id, first.sample_rate, first.pcm, iter(()))
            audio.rest = listener.rest_of(audio)
            return audio
        if isinstance(first, streams.StreamEnd):  # a job without a sound: nothing but its end
            return JobAudio(job_id, first.summary["sample_rate"], b"", iter(()), first.summary)
        if isinstance(first, streams.StreamFailed):
            raise ApiError(failed_status, f"job {job_id} failed: {first.exception()}")
    # No stream (any more): the job was not submitted with one, or it ended without one, or it expired.
    return _whole(job_id, connection, failed_status)


class StreamBroken(Exception):
    """A job's audio stopped short of its end: ``code`` says why (``failed``, ``cancelled``, ``restarted``,
    ``timeout``, ``hung_up``). Once audio has gone out, the response must end as incomplete, never as
    whole (see :func:`cut_off_when_broken`)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# A stop before any audio went out, as the status of the JSON error answered instead.
_STATUS_OF_STOP = {"timeout": 504, "hung_up": CLIENT_CLOSED}


def cut_off_when_broken(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The body of an audio response (call it in the view): ``chunks`` as they come, and on a
    :class:`StreamBroken` the connection cut without the chunked body's last chunk, so that a client sees
    an incomplete read (under gunicorn, the end it then writes fails on the closed socket, which it takes
    quietly; served by anything else, the error goes on up)."""
    connection = request.environ.get("gunicorn.socket")

    def body() -> Iterator[bytes]:
        try:
            yield from chunks
        except StreamBroken as stopped:
            if stopped.code == "hung_up":
                return
            logger.info("%s: the response is cut off", stopped.message)
            if connection is None:
                raise
            with contextlib.suppress(OSError):  # the client went first
                connection.shutdown(socket.SHUT_RDWR)

    return body()


class _Listener:
    """One reader of a job's stream: it follows the run it started in, in order, and sends a chunk only
    while the job is wanted (:mod:`web.delivery` records how far it got, for a cancel's charge)."""

    def __init__(self, job_id: str, connection):
        self.job_id = job_id
        self.connection = connection
        self.client = backends.current().redis
        self.results = backends.current().celery.backend
        self.delivery = Delivery(job_id)
        self.continuity = streams.Continuity()
        self.sent_s = 0.0
        self.entries = self._entries()

    def first_entry(self) -> streams.StreamEntry | None:
        """The stream's first entry, once its first audio (or end) is there and may be sent; None when the
        job has finished without a whole stream (revoked before it ran, expired, trimmed): it is then served
        whole, if at all."""
        for entry in self.entries:
            if not self.continuity.follows(entry):  # its start was trimmed away
                return None
            if isinstance(entry, streams.AudioChunk):
                self._may_send(entry)
            return entry
        return None

    def rest_of(self, audio: JobAudio) -> Iterator[bytes]:
        """The PCM of the audio entries after the first, up to the end, whose summary goes to ``audio``."""
        for entry in self.entries:
            if not self.continuity.follows(entry):
                raise StreamBroken(
                    "restarted",
                    f"job {self.job_id} lost its worker and runs again from its start: its audio restarted after"
                    f" {self.sent_s:.1f} s had gone out; GET /api/jobs/{self.job_id}/audio once it is done",
                )
            if isinstance(entry, streams.AudioChunk):
                self._may_send(entry)
                yield entry.pcm
            elif isinstance(entry, streams.StreamEnd):
                audio.summary = entry.summary
                return
            else:
                raise StreamBroken(
                    "failed", f"job {self.job_id} failed after {self.sent_s:.1f} s of audio: {entry.exception()}"
                )
        raise StreamBroken("failed", f"job {self.job_id} ended without the rest of its stream")

    def _may_send(self, chunk: streams.AudioChunk) -> None:
        if not self.delivery.may_send(self.sent_s + chunk.seconds):
            raise self._cancelled()
        self.sent_s += chunk.seconds

    def _cancelled(self) -> StreamBroken:
        return StreamBroken("cancelled", f"job {self.job_id} was cancelled after {self.sent_s:.1f} s of audio")

    def _entries(self) -> Iterator[streams.StreamEntry]:
        """The stream's entries as they come; it stops early when the job has finished without a stream
        (revoked before it ran, or its stream expired)."""
        after: bytes = b"0"
        last_heard = time.monotonic()
        while True:
            left_s = IDLE_TIMEOUT_S - (time.monotonic() - last_heard)
            # XREAD's BLOCK 0 would wait forever: at least a millisecond.
            block_ms = max(1, int(min(READ_BLOCK_S, left_s) * 1000))
            entries = streams.read(self.client, self.job_id, after=after, block_ms=block_ms)
            if not entries:
                if hung_up(self.connection):
                    logger.info("job %s: the client hung up its stream; the job goes on", self.job_id)
                    raise StreamBroken("hung_up", f"the client hung up; job {self.job_id} goes on")
                if self.delivery.cancelled():
                    raise self._cancelled()
                if time.monotonic() - last_heard >= IDLE_TIMEOUT_S:
                    raise StreamBroken("timeout", f"no audio from job {self.job_id} for {IDLE_TIMEOUT_S} s; it goes on")
                if self.results.get_task_meta(self.job_id)["status"] in states.READY_STATES:
                    # Its last entries are written before its state: one more look, then it has none.
                    for entry_id, entry in streams.read(self.client, self.job_id, after=after, block_ms=1):
                        after = entry_id
                        yield entry
                    return
                continue
            last_heard = time.monotonic()
            for entry_id, entry in entries:
                after = entry_id
                yield entry


@dataclass
class StoredJobAudio(JobAudio):
    """A finished job's audio as the store holds it, in ``stored_format``: its samples are read from
    the store (decoded, for a compressed format) only as they are sent."""

    stored: StoredAudio = field(kw_only=True)
    stored_format: str = field(kw_only=True)


def encoded(audio: JobAudio, audio_format: str) -> Iterator[bytes]:
    """The job's audio in ``audio_format`` (see :mod:`web.audio_formats`), encoded as its samples come;
    stored audio asked for in its own format is sent as the store holds it."""
    if isinstance(audio, StoredJobAudio) and audio.stored_format == audio_format:
        yield from _closing(audio.stored.chunks(), audio.stored)
        return
    encoding = audio_formats.encoder(audio_format, audio.sample_rate)
    try:
        for pcm in audio.pcm():
            data = encoding.encode(pcm)
            if data:
                yield data
        for data in encoding.finish():
            if data:
                yield data
    finally:
        encoding.close()


def _whole(job_id: str, connection, failed_status: int) -> JobAudio:
    """A job that does not stream: wait for it, then its stored audio."""
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
    audio = StoredJobAudio(
        job_id,
        job.result["sample_rate"],
        b"",
        _closing(_stored_pcm(job.format, stored), stored),
        job.result,
        stored=stored,
        stored_format=job.format,
    )
    db.session.close()
    return audio


def _stored_pcm(audio_format: str, stored: StoredAudio) -> Iterator[bytes]:
    pcm, _ = audio_formats.pcm_of_pieces(audio_format, stored.chunks())
    yield from pcm


def _closing(pcm: Iterator[bytes], stored: StoredAudio) -> Iterator[bytes]:
    try:
        yield from pcm
    finally:
        stored.close()
