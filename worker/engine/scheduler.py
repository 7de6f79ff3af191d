"""Which segments hold the engine's slots and its KV cache's blocks: torch-free bookkeeping.

Segments wait by priority (interactive before normal before bulk, see :class:`WaitingQueue`: a
segment that waits long enough goes up a class, so none waits forever behind a stream of higher
ones), then in the order their audio is wanted (:attr:`Segment.due`, then arrival: a streamed
request's first segment before the later segments of requests that came first, whose audio is not
played for seconds yet), and take the lowest free slots, so the running slots stay packed at the front
and a decode step runs on as few rows as possible. A running segment's cache grows by one
position a decode step: at the engine's clock ``c`` (the decode steps it will have run at the end of
this round) it fills ``min(start + c, end)`` positions, ``start`` and ``end`` fixed when it is
admitted. So the scheduler knows the clock at which each segment outgrows its blocks, and each round
grows only the segments due (about one in eight with blocks of 64 positions and rounds of 8 steps),
not all 2,048. Segments end in any order, leaving holes below the highest running slot, which every
decode step still covers: ``compact`` moves the highest running segments down into the holes (a
move copies a slot's own state, its hidden states so far included, and its block table's row; never
its cache). When the pool runs
dry, the newest running segments are preempted (their blocks go
back, and they wait again at the head of the queue, to start over with the same seed and draw the
same tokens). Waiting segments are admitted while their blocks fit with a block to spare for each
running segment, and not in a round that preempted, which would only run the preempted again to
preempt them once more.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from chattts_farm.contract import PRIORITIES
from worker.engine.blocks import BLOCK_POSITIONS, BlockPool, blocks_for
from worker.engine.segment import Segment, SegmentStatus

# Segments whose audio is wanted already (due by the round's ``now``) are admitted up to this many
# prefill passes a round; others one pass's worth. A burst of streams then hears its first chunks a
# round or two after it arrives, not one pass's worth of streams a round (256 streams at 64 a pass:
# the last heard 4 rounds after the first).
PASSES_FOR_DUE = 4

# A waiting segment goes up one priority class for each this many seconds its audio has been due: a
# bulk one counts as normal after 30 s and as interactive after 60 s, where it goes before every
# interactive segment that came after it. Interactive work takes the slots first, yet bulk work
# still progresses under a stream of it that would fill every slot. Running segments are never
# preempted for a waiting one's priority: only a dry KV pool preempts.
PRIORITY_AGING_S = 30.0

# demand(segment) -> (start, end): the positions a segment just admitted fills at clock c are min(start + c, end)
Demand = Callable[[Segment], tuple[int, int]]


@dataclass
class Schedule:
    admitted: list[Segment] = field(default_factory=list)
    preempted: list[tuple[int, Segment]] = field(default_factory=list)  # (the slot it left, the segment)
    new_blocks: list[tuple[int, int, int]] = field(default_factory=list)  # (slot, index in its table, block)


class Admission(NamedTuple):
    """A running segment's record: its admission's number (the order of admission), and its demand."""

    number: int
    start: int
    end: int


class WaitingQueue:
    """Segments waiting for a slot: a preempted segment before all others, in the order the preempted
    were admitted; then by priority class (its request's, raised one for each PRIORITY_AGING_S its
    audio has been due as of :attr:`now`), earliest due first within a class, in arrival order among
    equals."""

    def __init__(self) -> None:
        self._preempted: list[tuple[int, Segment]] = []
        # One heap per priority class, by (due, arrival): each heap's head has waited longest, so it
        # is raised at least as far as any other of its class, and the first of all is one of the heads.
        self._classes: list[list[tuple[float, int, Segment]]] = [[] for _ in PRIORITIES]
        self._arrivals = itertools.count()
        self.now = float("-inf")  # the clock segments are aged by: the scheduler's, at each round

    def add(self, segment: Segment) -> None:
        heapq.heappush(self._classes[PRIORITIES.index(segment.priority)], (segment.due, next(self._arrivals), segment))

    def put_back(self, segment: Segment, admission: int) -> None:
        heapq.heappush(self._preempted, (admission, segment))

    def first(self) -> Segment:
        return self._first_heap()[0][-1]

    def pop(self) -> Segment:
        return heapq.heappop(self._first_heap())[-1]

    def next(self, count: int) -> list[Segment]:
        """The ``count`` segments that come up next, in order."""
        preempted = [entry[-1] for entry in heapq.nsmallest(count, self._preempted)]
        waiting = (entry for heap in self._classes for entry in heap)
        return preempted + [entry[-1] for entry in heapq.nsmallest(count - len(preempted), waiting, key=self._rank)]

    def drop(self, should_drop: Callable[[Segment], bool]) -> list[Segment]:
        dropped = []
        for heap in (self._preempted, *self._classes):
            kept = [entry for entry in heap if not should_drop(entry[-1])]
            if len(kept) < len(heap):
                dropped += [entry[-1] for entry in heap if should_drop(entry[-1])]
                heap[:] = kept
                heapq.heapify(heap)
        return dropped

    def _rank(self, entry: tuple[float, int, Segment]) -> tuple[int, float, int]:
        due, arrival, segment = entry
        raised = int((self.now - due) // PRIORITY_AGING_S) if self.now > due else 0
        return max(PRIORITIES.index(segment.priority) - raised, 0), due, arrival

    def _first_heap(self) -> list:
        if self._preempted:
            return self._preempted
        return min((heap for heap in self._classes if heap), key=lambda heap: self._rank(heap[0]))

    def __iter__(self) -> Iterator[Segment]:
        preempted = (entry[-1] for entry in sorted(self._preempted))
        waiting = sorted((entry for heap in self._classes for entry in heap), key=self._rank)
        return itertools.chain(preempted, (entry[-1] for entry in waiting))

    def __len__(self) -> int:
        return len(self._preempted) + sum(len(heap) for heap in self._classes)


class Scheduler:
    def __init__(self, slots: int, max_admissions: int, kv_blocks: int):
        self.max_admissions = max_admissions
        self.pool = BlockPool(kv_blocks)
        self.waiting = WaitingQueue()
        self.running: dict[int, Segment] = {}
        self._free_slots = list(range(slots))
        self._admissions: dict[int, Admission] = {}  # per running slot
        # (the clock at which a segment outgrows its blocks, its admission's number); entries of
        # segments that have left since stay until they come up, and are passed over then.
        self._due: list[tuple[int, int]] = []
        self._slot_of: dict[int, int] = {}  # per running admission's number: its slot
        self._numbers = itertools.count()

    def add(self, segment: Segment) -> None:
        segment.status = SegmentStatus.WAITING
        self.waiting.add(segment)

    def schedule(self, clock: int, demand: Demand, now: float = float("-inf")) -> Schedule:
        """Give the running segments the blocks they fill by ``clock``, preempting the newest when
        the pool runs out; then admit waiting segments into free slots, lowest slots first, each with
        the blocks it fills by ``clock`` (its ``demand``): ``max_admissions`` of them, or up to
        PASSES_FOR_DUE times that while the next is due by ``now``."""
        schedule = Schedule()
        self.waiting.now = now
        while self._due and self._due[0][0] <= clock:
            _, number = heapq.heappop(self._due)
            slot = self._slot_of.get(number)
            if slot is None:  # it left
                continue
            needed = self._needed(slot, clock)
            while self.pool.missing(slot, needed) > self.pool.free and slot in self.running:
                newest = max(self.running, key=lambda running: self._admissions[running].number)
                schedule.preempted.append(self._preempt(newest))
            if slot in self.running:
                schedule.new_blocks.extend(self._grow(slot, needed))
        if schedule.preempted:
            # A segment grown earlier in the round may have been preempted after.
            schedule.new_blocks = [entry for entry in schedule.new_blocks if entry[0] in self.running]
            return schedule
        while self.waiting and self._free_slots:
            segment = self.waiting.first()
            if len(schedule.admitted) >= (self.most_admitted if segment.due <= now else self.max_admissions):
                break
            start, end = demand(segment)
            needed = min(start + clock, end)
            if blocks_for(needed) + len(self.running) > self.pool.free:
                break
            self.waiting.pop()
            slot = segment.slot = heapq.heappop(self._free_slots)
            segment.status = SegmentStatus.RUNNING
            self.running[slot] = segment
            self._admissions[slot] = Admission(next(self._numbers), start, end)
            self._slot_of[self._admissions[slot].number] = slot
            schedule.new_blocks.extend(self._grow(slot, needed))
            schedule.admitted.append(segment)
        return schedule

    def _needed(self, slot: int, clock: int) -> int:
        _, start, end = self._admissions[slot]
        return min(start + clock, end)

    def _grow(self, slot: int, needed: int) -> list[tuple[int, int, int]]:
        """The slot's blocks for ``needed`` positions (the pool has them), and when it needs more."""
        entries = [(slot, *entry) for entry in self.pool.grow(slot, needed)]
        number, start, end = self._admissions[slot]
        covered = self.pool.held(slot) * BLOCK_POSITIONS
        if covered < end:
            heapq.heappush(self._due, (covered - start + 1, number))
        return entries

    def compact(self) -> list[tuple[int, int]]:
        """Move the running segments above the lowest ``len(running)`` slots into the free slots below
        them, so that the running slots are packed at the front again (segments end in any order, and
        a step covers every slot up to the highest running one); returns the (from, to) moves. A
        segment keeps its blocks, its place in the order of admission and its growth."""
        packed = len(self.running)
        movers = sorted((slot for slot in self.running if slot >= packed), reverse=True)
        moves = []
        for source in movers:
            target = heapq.heappop(self._free_slots)
            segment = self.running.pop(source)
            segment.slot = target
            self.running[target] = segment
            self._admissions[target] = self._admissions.pop(source)
            self._slot_of[self._admissions[target].number] = target
            self.pool.tables[target] = self.pool.tables.pop(source)
            heapq.heappush(self._free_slots, source)
            moves.append((source, target))
        return moves

    def _preempt(self, slot: int) -> tuple[int, Segment]:
        admission = self._admissions[slot].number
        segment = self._free(slot)
        segment.status = SegmentStatus.WAITING
        self.waiting.put_back(segment, admission)
        return slot, segment

    def retire(self, slot: int) -> Segment:
        segment = self._free(slot)
        segment.status = SegmentStatus.FINISHED
        return segment

    def _free(self, slot: int) -> Segment:
        segment = self.running.pop(slot)
        segment.slot = None
        del self._slot_of[self._admissions.pop(slot).number]
        self.pool.release(slot)
        heapq.heappush(self._free_slots, slot)
        return segment

    def drop_waiting(self, should_drop: Callable[[Segment], bool]) -> list[Segment]:
        dropped = self.waiting.drop(should_drop)
        for segment in dropped:
            segment.status = SegmentStatus.FINISHED
        return dropped

    @property
    def most_admitted(self) -> int:
        """The most segments one round admits: PASSES_FOR_DUE passes of segments already due."""
        return PASSES_FOR_DUE * self.max_admissions

    @property
    def rows_in_use(self) -> int:
        """The slots a decode step must cover: up to the highest one running."""
        return max(self.running) + 1 if self.running else 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
