"""How a worker's process keeps its garbage collector from stopping its threads (worker.interpreter)."""

import subprocess
import sys
import textwrap


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
