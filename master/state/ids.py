"""The master's ids: unguessable put and pin ids, and allocation ids that only grow.

Layout: ids the master numbers (alloc, freed seq) are (epoch_ms << ID_EPOCH_SHIFT) + counter,
unique across master restarts because the epoch grows. An id off the wire above MAX_ID is not
one this cluster could have issued (epoch_ms < 2^41 until the year 2039, so 2^63 leaves room).
`AllocIds` hands them out; `ensure_above` moves the counter past an id a node reported, so a
new allocation never reuses an adopted one (an alloc id only grows, DESIGN write path).

Put and pin ids (`SecretIds`) are the ids a client quotes back (PutEnd, PutRevoke, Unpin).

Sequential ids let anyone who saw one id name the next writer's put or the next reader's pin.
These are 64 random bits from the OS (`os.urandom`), drawn in blocks of `BLOCK_IDS` so the hot
path pays a list pop, not a system call, per id. The master also binds each put and pin to the
tenant that received it (objects.Obj.tenant, pins.Pin.tenant), so a guessed id alone is not
enough either; the randomness keeps one tenant's clients from interfering with each other.
Ids are never 0 (0 means "none" on the wire). Collisions are 2^-64 per pair: puts and pins in
flight number at most millions, so the chance of one in a master's life is negligible, and a
collision would only make one PutEnd/Unpin miss (refused, never misattributed across tenants).
"""

from __future__ import annotations

import itertools
import os
from array import array

BLOCK_IDS = 1024
ID_EPOCH_SHIFT = 22
MAX_ID = (1 << 63) - 1


def epoch_base(epoch: int) -> int:
    """Every id a master of `epoch` numbers is above this; every id of an earlier one below."""
    return epoch << ID_EPOCH_SHIFT


class AllocIds:
    """`next()` returns the next allocation id; ids only grow."""

    __slots__ = ("next",)

    def __init__(self, epoch: int) -> None:
        self.next = itertools.count(epoch_base(epoch) + 1).__next__

    def ensure_above(self, alloc_id: int) -> None:
        """Make every future id greater than `alloc_id` (an adopted one)."""
        assert 0 < alloc_id <= MAX_ID, "rebuild refuses alloc ids a grant could not carry"
        if self.next() <= alloc_id:
            self.next = itertools.count(alloc_id + 1).__next__


class SecretIds:
    """`next()` returns a fresh random nonzero 64-bit id."""

    __slots__ = ("_pool",)

    def __init__(self) -> None:
        self._pool: list[int] = []

    def next(self) -> int:
        pool = self._pool
        while True:
            if not pool:
                pool.extend(array("Q", os.urandom(8 * BLOCK_IDS)))
            value = pool.pop()
            if value:
                return value
