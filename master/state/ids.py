"""Unguessable ids for puts and pins: the ids a client quotes back (PutEnd, PutRevoke, Unpin).

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

import os
from array import array

BLOCK_IDS = 1024


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
