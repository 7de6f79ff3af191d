"""Requests held open while their job runs (``/v1/audio/speech``), without starving anyone else.

The web serves under gevent (see ``chattts-farm web``): a waiting request is a greenlet parked on an
event, not a thread, so thousands wait for little. What each holds is kept small and bounded:

- a wait slot: a key has at most ``CHATTTS_FARM_MAX_WAITS_PER_KEY`` requests held at once, counted in
  Redis so the bound holds across web processes (with keys off, every caller shares one bound). A slot
  is a lease (``CHATTTS_FARM_WAIT_SLOT_LEASE_S``) that one keeper per process renews for as long as its
  request is held, whatever it waits on (a queued job, a client slow to read), so the slots of a killed
  web process, and only those, come free by themselves;
- a client that takes nothing of its answer for ``CHATTTS_FARM_STREAM_SEND_TIMEOUT_S`` is disconnected
  (within a third more), and its slot given back;
- no database connection: the pool is small and every request of the process shares it;
- no Redis reads of its own: one watcher per process reads the state of every awaited job in one
  MGET a few times a second and wakes the requests whose job has finished;
- nothing once the client hangs up: the wait ends, and the job goes on as an ordinary job of its key
  (listed at ``/api/jobs``, its audio at ``/api/jobs/<id>/audio``).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterator

from celery import states
from celery.backends.base import Backend
from flask import current_app, request
from redis.exceptions import RedisError

from chattts_farm import redis_keys
from chattts_farm.settings import ENV_PREFIX
from web import access, backends
from web.errors import too_many_requests

logger = logging.getLogger(__name__)

# A refused request may try again after this; slots come free as jobs finish, which takes seconds.
RETRY_AFTER_S = 5
# How soon a finished job's request is woken; one MGET of a thousand jobs costs the watcher ~4 ms.
WATCH_INTERVAL_S = 0.2
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
    """One of a key's places for a request held open on its job: take it before submitting, give it back
    (``with``, or :meth:`held_while` for a streamed answer) when the request ends, come what may."""

    def __init__(self, key: str, slot_id: str, keeper: _SlotKeeper):
        self.key = key
        self.slot_id = slot_id
        self.keeper = keeper
        # Kept: a streamed answer holds its slot after its request's context has gone.
        self.redis = backends.current().redis
        self.connection: socket.socket | None = request.environ.get("gunicorn.socket")
        self.request_line = f"{request.method} {request.path}"
        self.released = False

    @classmethod
    def take(cls) -> WaitSlot:
        """A slot of the caller's key; 429 while all are taken."""
        api_key = access.current_key()
        settings = current_app.config["SETTINGS"]
        bound, lease_s = settings.max_waits_per_key, settings.wait_slot_lease_s
        key = redis_keys.wait_slots(api_key.key_hash[:16] if api_key else "anonymous")
        slot_id = uuid.uuid4().hex
        # Lease ends are this host's clock, as the rate limits' minutes: web hosts keep time with NTP.
        now = time.time()
        taken = backends.current().redis.eval(_TAKE_SLOT, 1, key, now, bound, now + lease_s, slot_id, lease_s)
        if not taken:
            whose = "of this key" if api_key else "(keys are off: all callers share this bound)"
            raise too_many_requests(
                f"{bound} requests {whose} are already waiting for their audio ({ENV_PREFIX}MAX_WAITS_PER_KEY): "
                "try again once one has finished, or submit with POST /api/jobs and poll",
                RETRY_AFTER_S,
            )
        keeper = slot_keeper()
        slot = cls(key, slot_id, keeper)
        keeper.keep(slot)
        return slot

    def __enter__(self) -> WaitSlot:
        return self

    def __exit__(self, *_exception) -> None:
        self.release()

    def release(self) -> None:
        """Give the slot back (once, however often called)."""
        if not self.released:
            self.released = True
            self.keeper.drop(self)
            self.redis.zrem(self.key, self.slot_id)

    def held_while(self, chunks: Iterator[bytes | str]) -> _HeldAnswer:
        """A streamed answer's body: ``chunks``, the slot held until they have all gone to the server or it
        closes them (a client that hung up, or took nothing for ``CHATTTS_FARM_STREAM_SEND_TIMEOUT_S``)."""
        return _HeldAnswer(self, chunks)


class _HeldAnswer:
    """The body of a streamed answer. Not a generator: a generator's ``finally`` never runs when it is
    closed unstarted, as the body of a HEAD request is, and its slot would be held for good."""

    def __init__(self, slot: WaitSlot, chunks: Iterator[bytes | str]):
        self.slot = slot
        self.chunks = chunks
        # Since when the server has had a chunk, or the body's end, to write without asking for more.
        self.sending_since: float | None = None
        self.watched = False

    def __iter__(self) -> _HeldAnswer:
        return self

    def __next__(self) -> bytes | str:
        if not self.watched and self.slot.connection is not None:
            self.watched = True
            self.slot.keeper.watch(self)
        self.sending_since = None
        try:
            return next(self.chunks)
        except StopIteration:
            self.slot.release()
            raise
        finally:
            self.sending_since = time.monotonic()

    def close(self) -> None:
        try:
            close_chunks = getattr(self.chunks, "close", None)
            if close_chunks is not None:
                close_chunks()
        finally:
            self.slot.keeper.forget(self)
            self.slot.release()

    def disconnect(self, stalled_s: float) -> None:
        """End the connection of a client that takes nothing: the server's blocked write wakes and fails
        with EPIPE, which gunicorn takes quietly, and it closes this body. Shut down through a duplicate of
        the descriptor: gevent's shutdown of the connection itself would fail the write with an EBADF of its
        own making, which gunicorn logs as an error."""
        logger.info("%s: the client took nothing for %.0f s: disconnected", self.slot.request_line, stalled_s)
        self.sending_since = None
        connection = self.slot.connection
        # OSError: the client went first.
        with (
            contextlib.suppress(OSError),
            socket.fromfd(connection.fileno(), connection.family, connection.type) as twin,
        ):
            twin.shutdown(socket.SHUT_RDWR)


class _SlotKeeper:
    """Keeps a web process's held requests to their bounds: a thread (a greenlet, under gevent) that runs
    while any is held and, a few times a lease, renews every slot's lease in one Redis round trip, and ends
    the connections of clients that took nothing of their answers for the send timeout.

    gunicorn serves a connection without a timeout, so a client that reads nothing would hold its
    connection and its slot forever, and a slot renewed only as chunks go out would lapse, and let its
    key past its bound, while its request waits for a queued job. Slots and answers are held weakly: one
    its request dropped without giving it back (a bug, never a normal path) lapses as a killed process's
    do, rather than being kept for good."""

    def __init__(self, lease_s: int, send_timeout_s: int):
        self.lease_s = lease_s
        self.send_timeout_s = send_timeout_s
        self.redis = backends.current().redis
        self.slots: weakref.WeakSet[WaitSlot] = weakref.WeakSet()
        self.answers: weakref.WeakSet[_HeldAnswer] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.running = False

    def keep(self, slot: WaitSlot) -> None:
        self._hold(self.slots, slot)

    def drop(self, slot: WaitSlot) -> None:
        with self.lock:
            self.slots.discard(slot)

    def watch(self, answer: _HeldAnswer) -> None:
        self._hold(self.answers, answer)

    def forget(self, answer: _HeldAnswer) -> None:
        with self.lock:
            self.answers.discard(answer)

    def _hold(self, held: weakref.WeakSet, thing: WaitSlot | _HeldAnswer) -> None:
        with self.lock:
            held.add(thing)
            if not self.running:
                self.running = True
                threading.Thread(target=self._run, name="wait-slot-keeper", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(min(self.lease_s, self.send_timeout_s) / 3)
            with self.lock:
                if not self.slots and not self.answers:
                    self.running = False
                    return
                slots, answers = list(self.slots), list(self.answers)
            now = time.monotonic()
            for answer in answers:
                if answer.sending_since is not None and now - answer.sending_since >= self.send_timeout_s:
                    answer.disconnect(now - answer.sending_since)
            try:
                self._renew(slots)
            except RedisError as error:  # Redis away for a moment: the next rounds try again, within the lease
                logger.warning("could not renew the leases of %d wait slots: %s", len(slots), error)

    def _renew(self, slots: list[WaitSlot]) -> None:
        if not slots:
            return
        lease_ends = time.time() + self.lease_s
        pipeline = self.redis.pipeline(transaction=False)
        for slot in slots:
            # XX: a slot given back since it was listed is not taken again.
            pipeline.zadd(slot.key, {slot.slot_id: lease_ends}, xx=True)
        for key in {slot.key for slot in slots}:
            pipeline.expire(key, self.lease_s)
        pipeline.execute()


def slot_keeper() -> _SlotKeeper:
    # setdefault: two requests arriving together in a fresh process must share one keeper.
    settings = current_app.config["SETTINGS"]
    return current_app.extensions.setdefault(
        "wait_slot_keeper", _SlotKeeper(settings.wait_slot_lease_s, settings.stream_send_timeout_s)
    )


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
