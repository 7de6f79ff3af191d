import gc
import weakref

import torch

from bench.device import free_memory


class Node:
    def __init__(self) -> None:
        self.partner: Node | None = None


def test_free_memory_collects_what_a_run_dropped_in_cycles() -> None:
    # A runner and its graphs refer to each other: dropping the last name leaves them to the collector.
    first, second = Node(), Node()
    first.partner, second.partner = second, first
    dropped = weakref.ref(first)
    gc.disable()
    try:
        del first, second
        assert dropped() is not None
        free_memory(torch.device("cpu"))
        assert dropped() is None
    finally:
        gc.enable()
