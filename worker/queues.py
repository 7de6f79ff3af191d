"""Taking work off a queue in batches: the threads beside the engine serve everything waiting at once."""

from __future__ import annotations

import queue
from typing import TypeVar

Item = TypeVar("Item")


def take_waiting(source: queue.SimpleQueue[Item]) -> list[Item]:
    """Everything waiting in ``source``, after waiting for the first item."""
    taken = [source.get()]
    while True:
        try:
            taken.append(source.get_nowait())
        except queue.Empty:
            return taken
