"""The KV cache's bookkeeping (worker.engine.blocks, worker.engine.scheduler): blocks are taken as segments
grow and given back when they leave, and a pool that runs dry preempts the newest segments, which wait at
the head of the queue to start over. Waiting segments go by priority, each raised a class as it ages."""

from worker.engine.blocks import BLOCK_POSITIONS, BlockPool, blocks_for
from worker.engine.scheduler import PRIORITY_AGING_S, Scheduler
from worker.engine.segment import Segment, SegmentStatus


def segment(owner: int, due: float = 0.0, priority: str = "normal") -> Segment:
    return Segment(
        owner=owner,
        index=0,
        text="",
        request=None,
        speaker=None,
        seed=owner,
        expected_tokens=1,
        max_tokens=1,
        due=due,
        priority=priority,
    )


def test_a_slot_takes_blocks_as_it_grows_and_gives_them_all_back():
    pool = BlockPool(8)
    assert pool.grow(0, 1) == [(0, 0)]
    assert pool.grow(0, BLOCK_POSITIONS) == []  # still one block
    assert pool.grow(0, 2 * BLOCK_POSITIONS + 1) == [(1, 1), (2, 2)]
    assert pool.grow(1, BLOCK_POSITIONS) == [(0, 3)]
    assert (pool.free, pool.held(0), pool.missing(0, 4 * BLOCK_POSITIONS)) == (4, 3, 1)
    pool.release(0)
    assert pool.free == 7 and pool.held(0) == 0
    # Given back blocks are handed out again.
    assert sorted(block for _, block in pool.grow(2, 4 * BLOCK_POSITIONS)) == [0, 1, 2, 4]


def fixed(positions: int):
    """A demand of ``positions`` positions from the first round on, growing no further."""
    return lambda _: (positions, positions)


def test_segments_are_admitted_while_their_blocks_fit_with_one_to_spare_for_each_running_one():
    scheduler = Scheduler(slots=8, max_admissions=8, kv_blocks=6)
    for owner in range(4):
        scheduler.add(segment(owner))
    # Each needs one block now: the first takes one (5 left), the second one more with one spare for
    # the first (4 left), the third with two spare (3 left); the fourth would leave fewer than three.
    schedule = scheduler.schedule(0, fixed(BLOCK_POSITIONS))
    assert [s.owner for s in schedule.admitted] == [0, 1, 2]
    assert [s.slot for s in schedule.admitted] == [0, 1, 2]
    assert sorted(schedule.new_blocks) == [(0, 0, 0), (1, 0, 1), (2, 0, 2)]
    assert [s.owner for s in scheduler.waiting] == [3] and scheduler.pool.free == 3


def test_segments_wait_earliest_due_first_then_in_arrival_order():
    scheduler = Scheduler(slots=2, max_admissions=2, kv_blocks=8)
    for owner, due in enumerate([5.0, 0.0, 9.0, 0.0, 5.0]):
        scheduler.add(segment(owner, due))
    assert [s.owner for s in scheduler.waiting] == [1, 3, 0, 4, 2]
    assert [s.owner for s in scheduler.waiting.next(3)] == [1, 3, 0]
    assert [s.owner for s in scheduler.schedule(0, fixed(1)).admitted] == [1, 3]
    assert [s.owner for s in scheduler.waiting] == [0, 4, 2]


def test_segments_due_already_take_up_to_four_passes_a_round_and_the_others_one():
    scheduler = Scheduler(slots=32, max_admissions=2, kv_blocks=64)
    for owner in range(10):
        scheduler.add(segment(owner, due=1.0))
    for owner in range(10, 14):
        scheduler.add(segment(owner, due=5.0))
    # Due by now (3.0): four passes of two; the rest of the due and then the later ones: one pass.
    assert [s.owner for s in scheduler.schedule(0, fixed(1), now=3.0).admitted] == list(range(8))
    assert [s.owner for s in scheduler.schedule(8, fixed(1), now=3.0).admitted] == [8, 9]
    assert [s.owner for s in scheduler.schedule(16, fixed(1), now=3.0).admitted] == [10, 11]
    # Once they are due too, four passes again.
    assert [s.owner for s in scheduler.schedule(24, fixed(1), now=6.0).admitted] == [12, 13]


def test_a_running_segment_takes_a_block_in_the_round_it_outgrows_its_last():
    scheduler = Scheduler(slots=2, max_admissions=2, kv_blocks=8)
    scheduler.add(segment(0))
    # A prompt of 40 positions admitted at clock 0, then one position a step, up to 200.
    scheduler.schedule(8, lambda _: (40, 200))  # 48 positions by clock 8: one block
    grown = {clock: scheduler.schedule(clock, fixed(1)).new_blocks for clock in range(16, 200, 8)}
    # 64 positions by clock 24, 72 by 32: the second block comes in the round ending at 32; the
    # third at 96 (136 positions); the fourth at 160 (200, the end); then no more.
    assert {clock: entries for clock, entries in grown.items() if entries} == {
        32: [(0, 1, 1)],
        96: [(0, 2, 2)],
        160: [(0, 3, 3)],
    }
    assert scheduler.pool.held(0) == blocks_for(200)


def test_when_the_pool_runs_dry_the_newest_segments_are_preempted_and_wait_first_in_line():
    scheduler = Scheduler(slots=4, max_admissions=4, kv_blocks=8)
    for owner in range(3):
        scheduler.add(segment(owner, due=10.0))
    # One block each at first; by clock 4 * 64 each would fill five blocks.
    scheduler.schedule(0, lambda _: (BLOCK_POSITIONS, 5 * BLOCK_POSITIONS))
    scheduler.add(segment(3, due=0.0))
    # The oldest gets its blocks; the next, short of blocks, preempts the newest, then (still short) itself.
    schedule = scheduler.schedule(4 * BLOCK_POSITIONS, fixed(1))
    assert [(slot, s.owner) for slot, s in schedule.preempted] == [(2, 2), (1, 1)]
    assert [s.owner for s in scheduler.running.values()] == [0] and scheduler.pool.held(0) == 5
    assert {slot for slot, _, _ in schedule.new_blocks} == {0}
    # No admission in a round that preempted; the preempted wait first, in their old order, before
    # a segment due earlier than they were.
    assert schedule.admitted == []
    assert [s.owner for s in scheduler.waiting] == [1, 2, 3]
    assert all(s.slot is None and s.status is SegmentStatus.WAITING for s in scheduler.waiting)
    assert scheduler.pool.free == 3


def test_a_retired_segment_frees_its_slot_and_its_blocks_and_is_never_grown_again():
    scheduler = Scheduler(slots=2, max_admissions=2, kv_blocks=blocks_for(300) + 1)
    scheduler.add(segment(0))
    (admitted,) = scheduler.schedule(0, lambda _: (100, 300)).admitted
    scheduler.retire(admitted.slot)
    assert scheduler.pool.free == blocks_for(300) + 1 and not scheduler.running and not scheduler.has_work
    assert scheduler.schedule(300, fixed(1)).new_blocks == []


def test_compacting_moves_the_highest_running_segments_into_the_lowest_free_slots_with_their_blocks():
    scheduler = Scheduler(slots=6, max_admissions=6, kv_blocks=24)
    segments = [segment(owner) for owner in range(6)]
    for each in segments:
        scheduler.add(each)
    scheduler.schedule(0, lambda _: (BLOCK_POSITIONS, 4 * BLOCK_POSITIONS))
    for slot in (0, 2, 3):
        scheduler.retire(slot)
    tables = {slot: list(scheduler.pool.tables[slot]) for slot in (4, 5)}
    # Three run in slots 1, 4 and 5: 4 and 5 move into 0 and 2.
    assert scheduler.compact() == [(5, 0), (4, 2)]
    assert {slot: s.owner for slot, s in scheduler.running.items()} == {1: 1, 0: 5, 2: 4}
    assert segments[5].slot == 0 and segments[4].slot == 2 and scheduler.rows_in_use == 3
    assert scheduler.pool.tables[0] == tables[5] and scheduler.pool.tables[2] == tables[4]
    assert scheduler.compact() == []
    # A moved segment still grows when due, in its new slot; the newest is still preempted first.
    grown = scheduler.schedule(BLOCK_POSITIONS, fixed(1)).new_blocks
    assert sorted(slot for slot, _, _ in grown) == [0, 1, 2]
    assert {slot for slot, _, _ in scheduler.schedule(3 * BLOCK_POSITIONS, fixed(1)).new_blocks} == {0, 1, 2}
    starved = Scheduler(slots=4, max_admissions=4, kv_blocks=6)
    for owner in range(3):
        starved.add(segment(owner))
    starved.schedule(0, lambda _: (1, 4 * BLOCK_POSITIONS))
    starved.retire(0)
    assert starved.compact() == [(2, 0)]
    # Slot 0 now holds the newest (admitted third): it goes first when the pool runs dry.
    preempted = starved.schedule(4 * BLOCK_POSITIONS, fixed(1)).preempted
    assert [(slot, s.owner) for slot, s in preempted] == [(0, 2)]


def test_interactive_segments_take_free_slots_ahead_of_waiting_normal_and_bulk_ones_and_running_ones_stay():
    scheduler = Scheduler(slots=2, max_admissions=8, kv_blocks=64)
    for owner, priority in enumerate(["bulk", "normal", "bulk", "interactive", "normal"]):
        scheduler.add(segment(owner, priority=priority))
    assert [s.owner for s in scheduler.schedule(0, fixed(1), now=1.0).admitted] == [3, 1]
    assert [s.owner for s in scheduler.waiting] == [4, 0, 2]
    assert [s.owner for s in scheduler.waiting.next(2)] == [4, 0]
    # A later interactive segment waits for a slot to free: no running segment is preempted for it.
    scheduler.add(segment(5, due=1.0, priority="interactive"))
    schedule = scheduler.schedule(0, fixed(1), now=2.0)
    assert (schedule.admitted, schedule.preempted) == ([], [])
    scheduler.retire(0)
    assert [s.owner for s in scheduler.schedule(0, fixed(1), now=3.0).admitted] == [5]


def test_a_waiting_segment_goes_up_a_class_for_each_aging_period_its_audio_has_been_due():
    scheduler = Scheduler(slots=1, max_admissions=1, kv_blocks=64)
    scheduler.add(segment(0, due=0.0, priority="bulk"))
    scheduler.add(segment(1, due=PRIORITY_AGING_S + 10, priority="interactive"))
    scheduler.add(segment(2, due=PRIORITY_AGING_S + 5, priority="normal"))
    scheduler.waiting.now = PRIORITY_AGING_S + 15  # the bulk one counts as normal, and was due first
    assert [s.owner for s in scheduler.waiting] == [1, 0, 2]
    scheduler.waiting.now = 2 * PRIORITY_AGING_S + 5  # it counts as interactive, and so does the normal one
    assert [s.owner for s in scheduler.waiting] == [0, 2, 1]


def test_bulk_work_progresses_under_a_stream_of_interactive_work_that_fills_every_slot():
    scheduler = Scheduler(slots=1, max_admissions=1, kv_blocks=64)
    scheduler.add(segment(0, due=0.0, priority="bulk"))
    admitted = []
    for second in range(0, 4 * int(PRIORITY_AGING_S), 5):
        # Each round an interactive segment arrives and the running one ends.
        scheduler.add(segment(100 + second, due=second, priority="interactive"))
        for slot in list(scheduler.running):
            scheduler.retire(slot)
        admitted += [(second, s.owner) for s in scheduler.schedule(0, fixed(1), now=float(second)).admitted]
    assert (2 * PRIORITY_AGING_S, 0) in admitted
    assert [owner for _, owner in admitted].count(0) == 1
