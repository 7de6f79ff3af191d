"""Which segments hold the engine's slots: torch-free bookkeeping.

Segments wait in arrival order and take the lowest free slots, so the running slots stay packed at
the front and a decode step runs on as few rows as possible. A segment keeps its slot until it is
retired; nothing is preempted.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from worker.engine.segment import Segment, SegmentStatus


class Scheduler:
    def __init__(self, slots: int, max_admissions: int):
        self.max_admissions = max_admissions
        self.waiting: deque[Segment] = deque()
        self.running: dict[int, Segment] = {}
        self._free_slots = list(range(slots))

    def add(self, segment: Segment) -> None:
        segment.status = SegmentStatus.WAITING
        self.waiting.append(segment)

    def schedule(self) -> list[Segment]:
        """Move waiting segments into free slots, lowest slots first; returns those admitted."""
        admitted = []
        while self.waiting and self._free_slots and len(admitted) < self.max_admissions:
            segment = self.waiting.popleft()
            segment.slot = heapq.heappop(self._free_slots)
            segment.status = SegmentStatus.RUNNING
            self.running[segment.slot] = segment
            admitted.append(segment)
        return admitted

    def retire(self, slot: int) -> Segment:
        segment = self.running.pop(slot)
        segment.status = SegmentStatus.FINISHED
        segment.slot = None
        heapq.heappush(self._free_slots, slot)
        return segment

    def drop_waiting(self, should_drop: Callable[[Segment], bool]) -> list[Segment]:
        dropped = [segment for segment in self.waiting if should_drop(segment)]
        if dropped:
            self.waiting = deque(segment for segment in self.waiting if not should_drop(segment))
            for segment in dropped:
                segment.status = SegmentStatus.FINISHED
        return dropped

    @property
    def rows_in_use(self) -> int:
        """The slots a decode step must cover: up to the highest one running."""
        return max(self.running) + 1 if self.running else 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
