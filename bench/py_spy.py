"""py-spy's samples of running processes, and where each of their threads was: running Python, in native
code (torch's), in the CUDA driver, waiting on a lock (for a thread that runs torch's CUDA calls, mostly
the interpreter's lock, which it takes back after each call that let go of it), or waiting for I/O.

The question it answers (docs/performance.md, issues 22 and 23): the engine's thread spends more of its
own time on the host in a streamed level, and beside the ASR gate's thread, than without them, while it
waits for the GPU as long. Whether that time is its own Python, the driver's, or the interpreter's lock
held by another thread, only native stacks say; ``--native`` shows which library each frame is in.

py-spy pauses a process to take each sample (``--native`` cannot sample without pausing): at
``DEFAULT_RATE`` the process runs a little slower, so a recorded run's throughput is not to be compared
with an unrecorded one's.
"""

from __future__ import annotations

import collections
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_RATE = 100  # samples a second
# How long py-spy may take to attach (reading the symbols of the process's libraries), and to write its
# samples once told to stop.
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60

RUNNING_PYTHON = "running Python"
NATIVE = "native code"
CUDA_DRIVER = "CUDA driver"
GIL_WAIT = "the interpreter's lock"
LOCK_WAIT = "other locks, queues"
IO_WAIT = "I/O, sleeps"
PLACES = (RUNNING_PYTHON, NATIVE, CUDA_DRIVER, GIL_WAIT, LOCK_WAIT, IO_WAIT)
AT_WORK = (RUNNING_PYTHON, NATIVE, CUDA_DRIVER)

# A frame is "function (file.py:line)" (or "<string>:line", "<frozen runpy>:line") for Python, "symbol
# (library.so...)", "0xaddress (library.so...)" or, with debugging symbols, "symbol (file.c:line)" for
# native code; with --threads the first one names the thread: "thread (tid): name".
_PYTHON_FRAME = re.compile(r"\((?:[^()]*\.pyx?|<[^()]*>):\d+\)$")
_LIBRARY = re.compile(r"\(([^()]*\.so[.\d]*)\)$")
_THREAD = re.compile(r"^thread \((?:0x)?[0-9a-f]+\)(?::\s*(?P<name>.*))?$")
# A thread pool's threads, which Python names PREFIX_N (a Celery process's job threads: hundreds of them),
# are one row, PREFIX_*: each alone would fall under a summary's least share.
_POOL_THREAD = re.compile(r"_\d+$")
# Taking the interpreter's lock back: after a call that let go of it (a torch call, a numpy reduction, a
# blocking read), or between two bytecodes when another thread asked for it. take_gil waits on a timed
# condition (the switch interval at a time), and an interpreter without its symbols shows only that wait,
# below whatever let go of the lock: "THPVariable_clone;gil_scoped_release::~gil_scoped_release;
# pthread_cond_timedwait" (an H100 host's torch 2.11, 2026-12-06). CPython's own locks wait on semaphores,
# so a timed condition wait is the interpreter's lock.
_GIL_SYMBOLS = (
    "take_gil",
    "PyEval_RestoreThread",
    "PyEval_AcquireThread",
    "PyGILState_Ensure",
    "pthread_cond_timedwait",
)
# A Python lock's or queue's wait (threading, queue.SimpleQueue), with the interpreter's lock let go.
_PYTHON_LOCK_SYMBOLS = ("PyThread_acquire_lock",)
_WAIT_SYMBOLS = ("pthread_cond", "pthread_mutex", "sem_wait", "sem_timedwait", "sem_clockwait", "futex", "lll_lock")
_IO_SYMBOLS = ("epoll", "poll", "select", "recv", "read", "write", "send", "accept", "clock_nanosleep", "nanosleep")


@dataclass
class ThreadSamples:
    """Where one thread's samples were (PLACES), and in which of its Python functions."""

    name: str
    places: collections.Counter = field(default_factory=collections.Counter)
    # (innermost Python frame, place) -> samples
    functions: collections.Counter = field(default_factory=collections.Counter)

    @property
    def samples(self) -> int:
        return sum(self.places.values())


def place_of(frames: list[str]) -> str:
    """Where a sample's innermost frames say its thread was (one of PLACES)."""
    python = [index for index, frame in enumerate(frames) if _PYTHON_FRAME.search(frame)]
    native = frames[python[-1] + 1 :] if python else frames
    if python and not native:
        return RUNNING_PYTHON
    libraries = [match.group(1) for frame in native if (match := _LIBRARY.search(frame))]
    if any(library.startswith("libcuda.so") for library in libraries):
        return CUDA_DRIVER
    symbols = [frame.rsplit(" (", 1)[0].lstrip("_") for frame in native]
    for symbol in reversed(symbols):  # the innermost that says which lock decides
        if symbol.startswith(_GIL_SYMBOLS):
            return GIL_WAIT
        if symbol.startswith(_PYTHON_LOCK_SYMBOLS):
            return LOCK_WAIT
    if any(symbol.startswith(_WAIT_SYMBOLS) for symbol in symbols):
        # Straight from the interpreter into libc's wait: its own lock. From another library: that library's.
        return GIL_WAIT if python and libraries[:1] == ["libc.so.6"] else LOCK_WAIT
    if any(symbol.startswith(_IO_SYMBOLS) for symbol in symbols):
        return IO_WAIT
    return NATIVE


def read_samples(lines: Iterable[str]) -> dict[str, ThreadSamples]:
    """Each thread's samples, by its name, from py-spy's ``--format raw`` output (``--threads``)."""
    threads: dict[str, ThreadSamples] = {}
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        match = _THREAD.match(frames[0])
        name = _POOL_THREAD.sub("_*", match.group("name") or frames[0]) if match else "?"
        if match:
            frames = frames[1:]
        thread = threads.setdefault(name, ThreadSamples(name))
        place = place_of(frames)
        thread.places[place] += int(count)
        innermost = next((frame for frame in reversed(frames) if _PYTHON_FRAME.search(frame)), "(no Python frame)")
        thread.functions[innermost, place] += int(count)
    return threads


def py_spy() -> str:
    # A virtual environment's scripts sit beside its interpreter, on PATH or not.
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("py-spy is not on PATH: pip install py-spy (the project's test extra has it)")
    return found


@contextmanager
def recording(pids: Iterable[int], directory: Path, label: str, rate: int = DEFAULT_RATE) -> Iterator[list[Path]]:
    """Sample each process with py-spy while the block runs; yields the files their samples go to
    (``directory/label-PID.txt``), written once the block has ended."""
    directory.mkdir(parents=True, exist_ok=True)
    paths, samplers = [], []
    for pid in pids:
        path = directory / f"{label}-{pid}.txt"
        command = [py_spy(), "record", "--pid", str(pid), "--native", "--idle", "--threads"]
        command += ["--format", "raw", "--rate", str(rate), "--output", str(path)]
        # Its messages go to standard output, its errors to standard error: one pipe reads both.
        samplers.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        paths.append(path)
    for sampler in samplers:
        _wait_until_sampling(sampler)
    try:
        yield paths
    finally:
        for sampler in samplers:
            sampler.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
        for sampler, path in zip(samplers, paths, strict=True):
            said, _ = sampler.communicate(timeout=STOP_TIMEOUT_S)
            if not path.exists():
                raise RuntimeError(f"py-spy wrote no samples to {path}: {said.strip()[-500:]}")


def _wait_until_sampling(sampler: subprocess.Popen) -> None:
    """Until py-spy samples: with --native it first reads the symbols of every library the process has
    loaded (seconds for torch's), and a SIGINT before then would end it with nothing written."""
    deadline = time.monotonic() + START_TIMEOUT_S
    said = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sampler.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = sampler.stdout.readline() if ready else ""
        said.append(line)
        if "Sampling process" in line:
            return
        if not line and sampler.poll() is not None:
            break
    sampler.kill()
    raise RuntimeError(f"py-spy did not start sampling: {''.join(said).strip()[-500:]}")


def summary(path: Path, *, least_share: float = 0.01, functions: int = 8) -> str:
    """A markdown table of where each thread of one recording was (threads with at least ``least_share``
    of the samples), then the innermost Python functions of the thread most at work (AT_WORK)."""
    threads = read_samples(path.read_text().splitlines())
    total = sum(thread.samples for thread in threads.values()) or 1
    lines = [
        f"{path.name}: {total} samples",
        "",
        "| thread | samples | " + " | ".join(PLACES) + " |",
        "|---|---:|" + "---:|" * len(PLACES),
    ]
    shown = sorted(threads.values(), key=lambda thread: -thread.samples)
    for thread in shown:
        if thread.samples / total < least_share:
            continue
        shares = " | ".join(f"{thread.places[place] / thread.samples:.0%}" for place in PLACES)
        lines.append(f"| {thread.name} | {thread.samples} | {shares} |")
    busiest = max(shown, key=lambda thread: sum(thread.places[place] for place in AT_WORK), default=None)
    if busiest is not None and any(busiest.places[place] for place in AT_WORK):
        lines += ["", f"{busiest.name}: innermost Python functions", ""]
        lines += ["| function | place | share |", "|---|---|---:|"]
        for (function, place), count in busiest.functions.most_common(functions):
            lines.append(f"| {function} | {place} | {count / busiest.samples:.1%} |")
    return "\n".join(lines)
