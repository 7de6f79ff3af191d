"""bench/py_spy.py: where py-spy's native stacks say each thread was, read from stacks as py-spy writes
them (these from recordings on the development machine) and from a real recording of a real process."""

import subprocess
import sys
import textwrap

import pytest

from bench import py_spy
from tests.support import markdown_table

PYTHON = "Thread.run (threading.py:982);EngineServer._step (worker/engine_process/main.py:120)"


@pytest.mark.parametrize(
    ("innermost", "place"),
    [
        ("", py_spy.RUNNING_PYTHON),
        ("at::native::add_out (libtorch_cpu.so);0x7f41d54a3f16 (libc.so.6)", py_spy.NATIVE),
        ("memset (libc.so.6)", py_spy.NATIVE),
        (
            "cudaGraphLaunch (libcudart.so.12);0x7f0000001000 (libcuda.so.1);pthread_mutex_lock (libc.so.6)",
            py_spy.CUDA_DRIVER,
        ),
        # Between two bytecodes, another thread holding the interpreter's lock.
        ("pthread_cond_timedwait (libc.so.6);0x7f41d54a3f16 (libc.so.6)", py_spy.GIL_WAIT),
        # Taking it back after a torch call that let go of it.
        (
            "THPModule_replay (libtorch_python.so);PyEval_RestoreThread (libpython3.11.so.1.0);"
            "pthread_cond_timedwait (libc.so.6)",
            py_spy.GIL_WAIT,
        ),
        # ... in an interpreter whose take_gil py-spy cannot name: only its timed wait shows, below torch's or
        # numpy's call that let go of the lock (an H100 host's recording).
        (
            "torch::autograd::THPVariable_clone (libtorch_python.so);"
            "pybind11::gil_scoped_release::~gil_scoped_release (libtorch_python.so);"
            "pthread_cond_timedwait (libc.so.6);0x7fccf6698e51 (libc.so.6)",
            py_spy.GIL_WAIT,
        ),
        (
            "PyUFunc_GenericReduction (_multiarray_umath.cpython-312-x86_64-linux-gnu.so);"
            "pthread_cond_timedwait (libc.so.6);0x7fccf6698e51 (libc.so.6)",
            py_spy.GIL_WAIT,
        ),
        # A queue's get, and a lock of a library's own.
        (
            "_queue_SimpleQueue_get (_queuemodule.c.h:177);PyThread_acquire_lock_timed (libpython3.11.so.1.0);"
            "0x7ff1cdaaed90 (libc.so.6)",
            py_spy.LOCK_WAIT,
        ),
        ("c10::cuda::CUDACachingAllocator::malloc (libc10_cuda.so);pthread_mutex_lock (libc.so.6)", py_spy.LOCK_WAIT),
        ("time_sleep (libpython3.11.so.1.0);clock_nanosleep (libc.so.6)", py_spy.IO_WAIT),
        ("os_read (libpython3.11.so.1.0);read (libc.so.6)", py_spy.IO_WAIT),
    ],
)
def test_a_sample_is_placed_by_its_frames_below_the_innermost_python_one(innermost, place):
    frames = f"{PYTHON};{innermost}".rstrip(";").split(";")
    assert py_spy.place_of(frames) == place


def test_samples_are_summed_thread_by_thread_and_function_by_function():
    threads = py_spy.read_samples(
        [
            f"thread (7076): batcher;{PYTHON} 5",
            f"thread (7076): batcher;{PYTHON};pthread_cond_timedwait (libc.so.6) 3",
            f"thread (7076): batcher;{PYTHON} 2",
            "thread (7075): channel-sender;take_all (worker/batches.py:13);PyThread_acquire_lock_timed (libpy.so) 9",
            "thread (9374);0x7ff2b91e424a (libc.so.6);<module> (solo.py:4) 4",
            "",
        ]
    )
    assert set(threads) == {"batcher", "channel-sender", "thread (9374)"}
    batcher = threads["batcher"]
    assert batcher.samples == 10
    assert batcher.places == {py_spy.RUNNING_PYTHON: 7, py_spy.GIL_WAIT: 3}
    step = "EngineServer._step (worker/engine_process/main.py:120)"
    assert batcher.functions == {(step, py_spy.RUNNING_PYTHON): 7, (step, py_spy.GIL_WAIT): 3}
    assert threads["channel-sender"].places == {py_spy.LOCK_WAIT: 9}


def test_a_thread_pools_threads_are_summed_as_one_row():
    threads = py_spy.read_samples(
        [
            f"thread (7080): ThreadPoolExecutor-0_0;{PYTHON} 2",
            f"thread (7081): ThreadPoolExecutor-0_17;{PYTHON};pthread_cond_timedwait (libc.so.6) 3",
            f"thread (7082): ThreadPoolExecutor-0_767;{PYTHON} 1",
            f"thread (7075): channel-sender;{PYTHON} 4",
        ]
    )
    assert set(threads) == {"ThreadPoolExecutor-0_*", "channel-sender"}
    assert threads["ThreadPoolExecutor-0_*"].places == {py_spy.RUNNING_PYTHON: 3, py_spy.GIL_WAIT: 3}


CONTENDING = textwrap.dedent(
    """
    import sys, threading, time
    sys.setswitchinterval(0.0005)
    def spin():
        while True:
            sum(range(1000))
    threading.Thread(target=spin, name="spinner", daemon=True).start()
    threading.Thread(target=lambda: time.sleep(600), name="sleeper", daemon=True).start()
    print("started", flush=True)
    spin()
    """
)


def test_a_recording_of_two_threads_that_share_the_interpreter_shows_each_waiting_for_it(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", CONTENDING], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "started\n"
        with py_spy.recording([process.pid], tmp_path, "contending", rate=200) as (path,):
            subprocess.run(["sleep", "2"], check=True)
    finally:
        process.kill()
        process.wait()
    assert path == tmp_path / f"contending-{process.pid}.txt"
    threads = py_spy.read_samples(path.read_text().splitlines())
    assert {"MainThread", "spinner", "sleeper"} <= set(threads)
    # Two threads that never let go of the interpreter of their own accord take turns with it.
    for name in ("MainThread", "spinner"):
        places = threads[name].places
        assert places[py_spy.RUNNING_PYTHON] > 0.2 * threads[name].samples, places
        assert places[py_spy.GIL_WAIT] > 0.1 * threads[name].samples, places
    sleeper = threads["sleeper"].places
    assert sleeper[py_spy.IO_WAIT] > 0.9 * threads["sleeper"].samples, sleeper
    # The summary: a row a thread, its shares adding up to the whole; then the busiest thread's functions.
    lines = py_spy.summary(path).splitlines()
    assert lines[0] == f"{path.name}: {sum(thread.samples for thread in threads.values())} samples"
    rows = {row["thread"]: row for row in markdown_table(lines, "| thread |")}
    assert {"MainThread", "spinner", "sleeper"} <= set(rows)
    for row in rows.values():
        assert abs(sum(int(row[place].rstrip("%")) for place in py_spy.PLACES) - 100) <= len(py_spy.PLACES)
    functions = markdown_table(lines, "| function |")
    assert any(row["function"].startswith("spin (<string>:") for row in functions), functions


def test_a_process_that_is_not_there_is_a_clear_error(tmp_path):
    above_the_largest_pid = 2**22 + 1
    with (
        pytest.raises(RuntimeError, match="py-spy did not start sampling"),
        py_spy.recording([above_the_largest_pid], tmp_path, "gone"),
    ):
        pass
