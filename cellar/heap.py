"""Heap upkeep for the long-lived servers (master and storage node): keep CPython's cyclic GC off
their tables.

Both hold millions of long-lived objects (the master's object table, a node's index) that
outlive every collection. Left alone, CPython's oldest-generation collections walk all of them:
~1 s pauses at 10^6 objects in the master, ~15 us per object admitted at 2*10^5 index entries
in a node. So each server calls `freeze_survivors` periodically: the young generations are
collected (short-lived cycles from gRPC and asyncio die there) and the survivors move to the
permanent generation, which collections skip. Cost: O(objects created since the last call).

What is frozen is never collected: an object dropped alone is freed by reference counting (it
is unlinked from every table), but a whole table dropped at once is a web of cycles, so whoever
drops one calls `release_frozen`.
"""

from __future__ import annotations

import gc


def freeze_survivors() -> None:
    """Collect the young generations, then move every survivor out of the collector's reach."""
    gc.collect(1)
    gc.freeze()


def release_frozen() -> None:
    """Hand everything frozen back to the collector and run a full collection (seconds at 10^7
    objects); the next `freeze_survivors` freezes what is still alive."""
    gc.unfreeze()
    gc.collect()
