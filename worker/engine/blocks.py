"""Which blocks of the KV cache each slot holds: torch-free bookkeeping.

The cache is one pool of blocks of BLOCK_POSITIONS positions each, allocated once. A slot holds the
blocks its segment has filled or is about to fill, in order (its block table); it takes more as the
segment grows and gives them all back when the segment leaves. So the cache's memory follows what
segments use (a mean segment of the standard workload ends near 550 positions) rather than what the
longest segment could use (2,464 positions with the default limits), and the same memory runs ~4x
the segments.
"""

from __future__ import annotations

BLOCK_POSITIONS = 64


def blocks_for(positions: int) -> int:
    """How many blocks hold ``positions`` positions."""
    return -(-positions // BLOCK_POSITIONS)


class BlockPool:
    """``blocks`` blocks, numbered 0 .. blocks - 1, and the ones each slot holds."""

    def __init__(self, blocks: int):
        self.blocks = blocks
        # Taken from the end: a fresh pool hands out blocks 0, 1, 2, ... in order.
        self._free = list(range(blocks - 1, -1, -1))
        self.tables: dict[int, list[int]] = {}

    @property
    def free(self) -> int:
        return len(self._free)

    def held(self, slot: int) -> int:
        return len(self.tables.get(slot, ()))

    def missing(self, slot: int, positions: int) -> int:
        """The blocks ``slot`` lacks to hold ``positions`` positions."""
        return max(0, blocks_for(positions) - self.held(slot))

    def grow(self, slot: int, positions: int) -> list[tuple[int, int]]:
        """Give ``slot`` the blocks it lacks for ``positions`` positions (the caller checked that the
        pool has them); returns the (index in the slot's table, block) entries that are new."""
        table = self.tables.setdefault(slot, [])
        new = []
        for _ in range(self.missing(slot, positions)):
            new.append((len(table), self._free.pop()))
            table.append(new[-1][1])
        return new

    def release(self, slot: int) -> None:
        """Take back every block ``slot`` holds."""
        self._free.extend(reversed(self.tables.pop(slot, [])))
