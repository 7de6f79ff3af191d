"""Requests held open while their job runs (``/v1/audio/speech``), without starving anyone else.

The web serves under gevent (see ``chattts-farm web``): a waiting request is a greenlet parked on an
event, not a thread, so thousands wait for little. What each holds is kept small and bounded:

- a wait slot: a key has at most ``CHATTTS_FARM_MAX_WAITS_PER_KEY`` requests waiting at once, counted in
  Redis so the bound holds across web processes (with keys off, every caller shares one bound). A slot
  is a lease renewed while its request waits, so the slots of a killed web process come free by
  themselves;
- no database connection: the pool is small and every request of the process shares it;
- no Redis reads of its own: one watcher per process reads the state of every awaited job in one
  MGET a few times a second and wakes the requests whose job has finished;
- nothing once the client hangs up: the wait ends, and the job goes on as an ordinary job of its key
  (listed at ``/api/jobs``, its audio at ``/api/jobs/<id>/audio``).
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator

from celery import states
from celery.backends.base import Backend
from flask import current_app, request
from redis.exceptions import RedisError

from chattts_farm import redis_keys
from chattts_farm.settings import ENV_PREFIX
from web import access, backends, jobs
from web.errors import ApiError, too_many_requests
from web.models import Job, db

logger = logging.getLogger(__name__)

# A slot outlives its request's last sign of life by at most this much (a web process killed mid-wait).
SLOT_LEASE_S = 60
# A refused request may try again after this; slots come free as jobs finish, which takes seconds.
RETRY_AFTER_S = 5
# How soon a finished job's request is woken; one MGET of a thousand jobs costs the watcher ~4 ms.
WATCH_INTERVAL_S = 0.2
# How soon a waiting request notices that its client has hung up (a peek at its socket).
CHECK_CLIENT_S = 1.0
# nginx's code for "the client closed the request": only the access log ever sees it.
CLIENT_CLOSED = 499

# Atomic, so that web processes taking slots at the same moment never pass the bound together.
# Slots whose lease has ended are dropped first: their request's process died without giving them back.
_TAKE_SLOT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
    return 0
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


class WaitSlot:
    """One of a key's places for a request waiting on its job: take it before submitting, give it back
    (``with``) when the request ends, come what may."""

    def __init__(self, key: str, slot_id: str, lease_s: float):
        self.key = key
        self.slot_id = slot_id
        self.lease_s = lease_s
        self.renew_at = time.monotonic() + lease_s / 3
        # Kept: a streamed answer holds its slot after its request's context has gone.
        self.redis = backends.current().redis
        self.released = False

    @classmethod
    def take(cls, lease_s: float = SLOT_LEASE_S) -> WaitSlot:
        """A slot of the caller's key; 429 while all are taken."""
        api_key = access.current_key()
        bound = current_app.config["SETTINGS"].max_waits_per_key
        key = redis_keys.wait_slots(api_key.key_hash[:16] if api_key else "anonymous")
        slot_id = uuid.uuid4().hex
        # Lease ends are this host's clock, as the rate limits' minutes: web hosts keep time with NTP.
        now = time.time()
        taken = backends.current().redis.eval(
            _TAKE_SLOT, 1, key, now, bound, now + lease_s, slot_id, math.ceil(lease_s)
        )
        if not taken:
            whose = "of this key" if api_key else "(keys are off: all callers share this bound)"
            raise too_many_requests(
                f"{bound} requests {whose} are already waiting for their audio ({ENV_PREFIX}MAX_WAITS_PER_KEY): "
                "try again once one has finished, or submit with POST /api/jobs and poll",
                RETRY_AFTER_S,
            )
        return cls(key, slot_id, lease_s)

    def __enter__(self) -> WaitSlot:
        return self

    def __exit__(self, *_exception) -> None:
        self.release()

    def release(self) -> None:
        """Give the slot back (once, however often called)."""
        if not self.released:
            self.released = True
            self.redis.zrem(self.key, self.slot_id)

    def held_while(self, chunks: Iterator[bytes | str]) -> Iterator[bytes | str]:
        """The chunks of a streamed answer, the slot kept while they go out and given back when they
        end, or when the client hangs up (the server closes the iterator)."""
        try:
            for chunk in chunks:
                self.keep()
                yield chunk
        finally:
            self.release()

    def keep(self) -> None:
        """Renew the lease, a few times a lease, while the request still waits."""
        if time.monotonic() < self.renew_at:
            return
        pipeline = self.redis.pipeline()
        pipeline.zadd(self.key, {self.slot_id: time.time() + self.lease_s})
        pipeline.expire(self.key, math.ceil(self.lease_s))
        pipeline.execute()
        self.renew_at = time.monotonic() + self.lease_s / 3

    def wait_for(self, job: Job, timeout_s: float) -> Job:
        """Hold the request until its job has finished; the job, brought up to date.

        504 past ``timeout_s``, 499 once the client has hung up: either way the job goes on.
        """
        job_id = job.id
        # Hand the request's database connection back to the pool for the wait.
        db.session.close()
        connection = request.environ.get("gunicorn.socket")
        deadline = time.monotonic() + timeout_s
        watcher = job_watcher()
        finished = watcher.watch(job_id)
        try:
            while not finished.wait(min(CHECK_CLIENT_S, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    raise ApiError(
                        504, f"job {job_id} did not finish in {timeout_s} s; it goes on: GET /api/jobs/{job_id}"
                    )
                if hung_up(connection):
                    logger.info("job %s: the client hung up while waiting; the job goes on", job_id)
                    raise ApiError(CLIENT_CLOSED, f"the client hung up; job {job_id} goes on: GET /api/jobs/{job_id}")
                self.keep()
        finally:
            watcher.forget(job_id, finished)
        return jobs.refresh(db.session.get(Job, job_id))


class _JobWatcher:
    """Wakes the requests of one web process whose job has finished: a thread (a greenlet, under gevent)
    that runs while any request waits, reading every awaited job's state in one MGET."""

    def __init__(self, backend: Backend):
        self.backend = backend
        # Several requests may await one job (two listeners of its stream): an event each.
        self.waiting: dict[str, set[threading.Event]] = {}
        self.lock = threading.Lock()
        self.running = False

    def watch(self, job_id: str) -> threading.Event:
        """An event set once the job has finished; give it back with :meth:`forget`."""
        finished = threading.Event()
        with self.lock:
            self.waiting.setdefault(job_id, set()).add(finished)
            if not self.running:
                self.running = True
                threading.Thread(target=self._run, name="job-watcher", daemon=True).start()
        return finished

    def forget(self, job_id: str, finished: threading.Event) -> None:
        with self.lock:
            events = self.waiting.get(job_id, set())
            events.discard(finished)
            if not events:
                self.waiting.pop(job_id, None)

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.waiting:
                    self.running = False
                    return
                awaited = {job_id: set(events) for job_id, events in self.waiting.items()}
            try:
                self._wake_finished(awaited)
            except RedisError as error:  # Redis away for a moment: the requests wait on, up to their timeout
                logger.warning("could not read the state of %d awaited jobs: %s", len(awaited), error)
            time.sleep(WATCH_INTERVAL_S)

    def _wake_finished(self, awaited: dict[str, set[threading.Event]]) -> None:
        metas = self.backend.mget([self.backend.get_key_for_task(job_id) for job_id in awaited])
        for events, meta in zip(awaited.values(), metas, strict=True):
            if meta is not None and self.backend.decode_result(meta)["status"] in states.READY_STATES:
                for finished in events:
                    finished.set()


def job_watcher() -> _JobWatcher:
    # setdefault: two requests arriving together in a fresh process must share one watcher.
    return current_app.extensions.setdefault("job_watcher", _JobWatcher(backends.current().celery.backend))


def hung_up(connection: socket.socket | None) -> bool:
    """Whether the client has closed its connection; it sends nothing while it waits for its answer, so a
    peek finds nothing there, where a closed connection reads as end of file, or as a reset."""
    if connection is None:  # not served by gunicorn (Flask's test client): nothing to watch
        return False
    timeout = connection.gettimeout()
    connection.settimeout(0)
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        connection.settimeout(timeout)
