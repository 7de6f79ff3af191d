"""The channel between a worker's Celery side and its engine process: msgpack messages on a socket pair.

Torch-free; both sides import it. A message is a map with a ``kind`` and plain fields; audio travels as
float32 bytes, never as pickled tensors or arrays. Framing is multiprocessing's (a length, then the
bytes), on a Unix socket: the one the engine process inherits as a file descriptor from the Celery
process that started it, and one more for each other Celery process of its GPU, which connects to the
socket the engine listens on (see ``CHATTTS_FARM_CELERY_PROCESSES``). A message is one frame (its count
of blobs, then its msgpack), then a frame for each of its :class:`Blob` fields: those bytes go from the
sender's memory to the socket with no copy under the interpreter's lock, where packed into the message
each row of audio (~1 MB) was copied twice more on the engine process's threads. A sender with many
messages waiting writes them all with one system call (:meth:`Channel.send_all`): every write lets
go of the interpreter's lock and takes it back, and each time the engine's thread, which lets go of it
at every CUDA call, may have to wait for the sender to be done with it (on an H100, 2026-12-05, a
streamed level of 256 streams cost the engine's thread 0.37-0.61 s more of host work than an
unstreamed one, while its sender wrote three times for each of ~2,000 pieces).

The messages (field names in brackets):

- Celery side to engine: ``submit`` [job, arguments, started_at, started_wall, sent_samples, stream],
  ``cancel`` [job], ``ask`` [ask, question, argument].
- Engine to Celery side: ``ready`` [model, pid] or ``failed`` [error] once at start; then ``audio`` [job,
  segment, pcm], ``finished`` [job, started_at, started_wall, first_audio_at, result | error], ``status`` [jobs, stats,
  gpu] every half second, ``answer`` [ask, value | error].
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import msgpack
import numpy as np

from chattts_farm import contract
from chattts_farm.contract import FarmError, SynthesisFailed

# Each side buffers this much before a send waits for the other to read: a second of a busy engine's
# audio chunks, so its thread rarely waits on the worker's.
SOCKET_BUFFER_BYTES = 8 * 2**20
# One writev takes at most this many buffers (IOV_MAX).
_MOST_BUFFERS_A_WRITE = os.sysconf("SC_IOV_MAX")


# The msgpack extension type that stands for a blob in a message: its data is the blob's index.
_BLOB = 1


@dataclass(frozen=True)
class Blob:
    """Bytes a message carries in a frame of their own (the receiver finds ``bytes`` in their place)."""

    data: memoryview


def float32_bytes(samples: np.ndarray) -> Blob:
    """Samples as the float32 bytes a message carries; samples that are float32 in one block already
    are not copied on their way to the socket."""
    return Blob(memoryview(np.ascontiguousarray(samples, dtype=np.float32)).cast("B"))


def _plain(value: Any) -> Any:
    """msgpack's fallback: numpy scalars (quality figures) as Python numbers."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot send a {type(value).__name__} over the engine channel")


class Channel:
    """One end of the channel; ``send`` may be called from any thread, ``receive`` from one."""

    def __init__(self, connection: Connection):
        self._connection = connection
        self._send_lock = threading.Lock()

    @classmethod
    def pair(cls) -> tuple[Channel, socket.socket]:
        """This side's end, and the socket to hand to the engine process (see :meth:`from_fd`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (ours, theirs):
            _size_buffers(end)
        return cls(Connection(ours.detach())), theirs

    @classmethod
    def from_fd(cls, fd: int) -> Channel:
        return cls(Connection(fd))

    @classmethod
    def connect(cls, path: str) -> Channel:
        """This side's end of a channel to the engine listening at ``path``; OSError if none does."""
        end = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _size_buffers(end)
            end.connect(path)
        except OSError:
            end.close()
            raise
        return cls(Connection(end.detach()))

    @classmethod
    def accept(cls, listener: socket.socket) -> Channel:
        """The engine's end of the next channel a Celery process opens on ``listener`` (see :func:`listen`)."""
        end, _ = listener.accept()
        _size_buffers(end)
        return cls(Connection(end.detach()))

    def send(self, kind: str, **fields: Any) -> None:
        """Send one message; OSError (BrokenPipeError, ...) once the other side has gone."""
        self.send_all([(kind, fields)])

    def send_all(self, messages: list[tuple[str, dict[str, Any]]]) -> None:
        """Send (kind, fields) messages in order, in as few system calls as the socket takes; OSError
        (BrokenPipeError, ...) once the other side has gone."""
        buffers: list[bytes | memoryview] = []  # each frame after its length
        for kind, fields in messages:
            blobs: list[memoryview] = []

            def lift(value: Any, blobs=blobs) -> Any:
                if isinstance(value, Blob):
                    blobs.append(value.data)
                    return msgpack.ExtType(_BLOB, (len(blobs) - 1).to_bytes(4, "big"))
                return _plain(value)

            packed = msgpack.packb({"kind": kind, **fields}, default=lift, use_bin_type=True)
            for frame in (len(blobs).to_bytes(4, "big") + packed, *blobs):
                buffers += (_frame_header(len(frame)), frame)
        with self._send_lock:
            _write_all(self._connection.fileno(), buffers)

    def receive(self) -> dict:
        """The next message; EOFError once the other side has gone."""
        try:
            raw = self._connection.recv_bytes()
            blobs = [self._connection.recv_bytes() for _ in range(int.from_bytes(raw[:4], "big"))]
        except OSError as error:  # ConnectionResetError among them
            raise EOFError(str(error)) from error

        def blob(code: int, data: bytes) -> Any:
            return blobs[int.from_bytes(data, "big")] if code == _BLOB else msgpack.ExtType(code, data)

        return msgpack.unpackb(memoryview(raw)[4:], raw=False, ext_hook=blob)

    def close(self) -> None:
        self._connection.close()


def listen(path: str) -> socket.socket:
    """A socket at ``path`` on which the GPU's other Celery processes open their channels to its engine;
    a socket left there by an engine process that died is replaced. Only this user may connect: the
    directory it lies in is the supervisor's own (mode 0700)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    return listener


def _frame_header(size: int) -> bytes:
    """A frame's length as multiprocessing's Connection writes it and ``recv_bytes`` reads it."""
    if size > 0x7FFFFFFF:
        return struct.pack("!i", -1) + struct.pack("!Q", size)
    return struct.pack("!i", size)


def _write_all(fd: int, buffers: list[bytes | memoryview]) -> None:
    """Write every buffer, in order, a batch of them to each ``writev``, which may write only part."""
    waiting = [memoryview(buffer).cast("B") for buffer in buffers if len(buffer)]
    first = 0
    while first < len(waiting):
        written = os.writev(fd, waiting[first : first + _MOST_BUFFERS_A_WRITE])
        while written:
            if written >= len(waiting[first]):
                written -= len(waiting[first])
                first += 1
            else:
                waiting[first] = waiting[first][written:]
                written = 0


def _size_buffers(end: socket.socket) -> None:
    end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)


def error_fields(error: BaseException) -> dict:
    """An error as plain fields: its type's name and its arguments."""
    return {"type": type(error).__name__, "args": [str(argument) for argument in error.args]}


def error_from(fields: dict) -> FarmError:
    """The farm error the fields name; any other kind of error as :class:`SynthesisFailed`."""
    kind = getattr(contract, fields["type"], None)
    if isinstance(kind, type) and issubclass(kind, FarmError):
        try:
            return kind(*fields["args"])
        except TypeError:
            pass
    return SynthesisFailed(f"{fields['type']}: {': '.join(fields['args'])}")
