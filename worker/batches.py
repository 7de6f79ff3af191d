"""Work handed to one writer thread and done in batches: one Redis round trip for all that is queued."""

from __future__ import annotations

import queue
from typing import TypeVar

Item = TypeVar("Item")


def take_all(waiting: queue.SimpleQueue[Item]) -> list[Item]:
    """Everything queued: the first item waited for, the rest that came meanwhile as they are."""
    items = [waiting.get()]
    while True:
        try:
            items.append(waiting.get_nowait())
        except queue.Empty:
            return items
