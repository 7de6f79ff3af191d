"""Writes the audio of this worker's streaming jobs to their Redis streams (see chattts_farm.streams).

The engine's thread only queues float samples here: one thread turns them into 16-bit PCM and writes
every job's new chunks in one pipeline, so many streams cost one round trip, and a job's entries keep
the order they were queued in (its audio, then its end or error). Pieces of one segment that waited
together go out as one entry: a writer that falls behind (many streams, a busy host) catches up in
fewer commands, with the same samples. A job's last entry is written
before its task returns (``end`` and ``failed`` wait for it): a reader that sees the job finished
in Celery has its whole stream.

Each run of a job (a job whose worker was lost runs again, elsewhere) begins by emptying its stream, and
every entry names its run: a reader can tell a restart from more of the same audio.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid

import numpy as np
import redis

from chattts_farm import streams
from chattts_farm.contract import FarmError
from worker import audio
from worker.audio import SAMPLE_RATE
from worker.batches import take_all

logger = logging.getLogger(__name__)

# A task waits at most this long for its last stream entry to be written (Redis away: it goes on).
LAST_ENTRY_WAIT_S = 10


class _Begin:
    """A job's run begins: its stream is emptied before anything of the run is written."""


class StreamPublisher:
    def __init__(self, client: redis.Redis, *, ttl_s: int, max_entries: int):
        self.client = client
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._queue: queue.SimpleQueue[tuple[str, object, threading.Event | None]] = queue.SimpleQueue()
        # job id -> (its run, the seq of its next entry): the writer's thread only
        self._runs: dict[str, tuple[str, int]] = {}
        threading.Thread(target=self._serve, name="stream-publisher", daemon=True).start()

    def begin(self, job_id: str) -> None:
        """A run of the job starts here: what an earlier run wrote goes."""
        self._queue.put((job_id, _Begin(), None))

    def audio(self, job_id: str, segment: int, samples: np.ndarray) -> None:
        self._queue.put((job_id, (segment, samples), None))

    def end(self, job_id: str, summary: dict) -> None:
        self._last(job_id, summary)

    def failed(self, job_id: str, error: FarmError) -> None:
        self._last(job_id, error)

    def _last(self, job_id: str, item: object) -> None:
        written = threading.Event()
        self._queue.put((job_id, item, written))
        if not written.wait(LAST_ENTRY_WAIT_S):
            logger.warning("the last stream entry of job %s was not written within %g s", job_id, LAST_ENTRY_WAIT_S)

    def _serve(self) -> None:
        while True:
            items = take_all(self._queue)
            by_job: dict[str, list[object]] = {}
            begun: set[str] = set()
            for job_id, item, _ in items:
                if isinstance(item, _Begin):
                    self._runs[job_id] = (uuid.uuid4().hex[:12], 0)
                    begun.add(job_id)
                    by_job[job_id] = []  # nothing queued before a run begins belongs to it
                else:
                    by_job.setdefault(job_id, []).append(item)
            pipeline = self.client.pipeline(transaction=False)
            for job_id in begun:
                streams.restart(pipeline, job_id)
            for job_id, queued in by_job.items():
                if queued:
                    entries = [self._entry(job_id, item) for item in merged(queued)]
                    streams.append(pipeline, job_id, entries, ttl_s=self.ttl_s, max_entries=self.max_entries)
            try:
                pipeline.execute()
            except redis.RedisError as error:
                # The whole audio is stored with the result: a reader can still fetch it.
                logger.warning("%d stream entries of %d job(s) not written: %s", len(items), len(by_job), error)
            for _, _, written in items:
                if written is not None:
                    written.set()

    def _entry(self, job_id: str, item: object) -> streams.StreamEntry:
        # A job failed before its run began (a bad argument) has no run of its own.
        run, seq = self._runs.get(job_id, ("", 0))
        if isinstance(item, tuple):
            segment, samples = item
            self._runs[job_id] = (run, seq + 1)
            return streams.AudioChunk(seq, segment, SAMPLE_RATE, audio.pcm16(samples), run)
        self._runs.pop(job_id, None)  # the job's last entry
        if isinstance(item, FarmError):
            return streams.StreamFailed.of(seq, item, run)
        return streams.StreamEnd(seq, item, run)


def merged(queued: list[object]) -> list[object]:
    """A job's queued items, each run of audio pieces of one segment joined into one: a writer that fell
    behind catches up in fewer, larger entries (the same samples, in the same order), and one that keeps
    up sends each piece as it comes."""
    items: list[object] = []
    for item in queued:
        if isinstance(item, tuple):
            segment, samples = item
            if items and isinstance(items[-1], list) and items[-1][0] == segment:
                items[-1][1].append(samples)
                continue
            item = [segment, [samples]]  # a run of pieces, joined below
        items.append(item)
    return [
        (item[0], item[1][0] if len(item[1]) == 1 else np.concatenate(item[1])) if isinstance(item, list) else item
        for item in items
    ]
