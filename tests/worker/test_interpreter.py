"""How a worker's process starts its threads and keeps its garbage collector from stopping them
(worker.interpreter)."""

import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

from worker.interpreter import start_threads_ahead


def test_freezing_the_start_up_heap_collects_its_garbage_and_keeps_the_rest_out_of_later_passes():
    # In a process of its own: a frozen heap stays frozen, and the test process's must not.
    script = textwrap.dedent(
        """
        import gc, weakref
        from worker.interpreter import freeze_start_up_heap

        class Node:
            pass

        garbage = Node()
        garbage.itself = garbage
        gone = weakref.ref(garbage)
        del garbage
        kept = Node()
        freeze_start_up_heap()
        assert gone() is None, "a cycle left by start-up was not collected"
        assert gc.get_freeze_count() > 0
        assert all(o is not kept for o in gc.get_objects()), "a live object is still in the collector's passes"
        later = Node()
        assert any(o is later for o in gc.get_objects()), "an object made later is out of the passes"
        """
    )
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0, finished.stderr


def test_threads_started_ahead_are_idle_and_serve_later_tasks_without_starting_more():
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="ahead") as executor:
        start_threads_ahead(executor, 8)
        assert len(_threads_named("ahead")) == 8
        # Eight tasks at once, each waiting for the others: all run on the eight threads already there.
        together = threading.Barrier(8)
        ran_on = [executor.submit(lambda: (together.wait(timeout=10), threading.current_thread())[1]) for _ in range(8)]
        assert {future.result(timeout=10) for future in ran_on} == set(_threads_named("ahead"))
        assert len(_threads_named("ahead")) == 8


def _threads_named(prefix: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(prefix + "_")]
