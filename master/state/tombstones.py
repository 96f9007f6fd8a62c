"""Tombstones: what a late index report must not bring back.

Owns two memories of removal, both consulted by rebuild (master/node_rpcs.py):
- removed keys: (tenant, key) -> an alloc id drawn when a client removed the key. Every replica
  of any value written before the remove has a smaller id, so a node that was away (or whose
  freed notice had not arrived) and still reports such a replica is refused. Bounded by
  `max_remove_tombstones` (oldest forgotten first; 0 keeps none);
- freed while down: node id -> alloc ids the master told a previous incarnation of that node to
  free, so a node restart does not undo a remove or an eviction.

It never drops objects or frees ranges itself.
"""

from __future__ import annotations

from collections import OrderedDict


class Tombstones:
    def __init__(self, max_removed: int) -> None:
        self.max_removed = max_removed
        self.removed: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._freed_while_down: dict[str, set[int]] = {}

    def remember_removed(self, tenant_name: str, key: str, alloc_id: int) -> None:
        if not self.max_removed:
            return
        name = (tenant_name, key)
        self.removed[name] = alloc_id
        self.removed.move_to_end(name)
        while len(self.removed) > self.max_removed:
            self.removed.popitem(last=False)

    def removed_alloc_id(self, tenant_name: str, key: str) -> int:
        """The alloc id drawn when the key was last removed (0: none remembered)."""
        return self.removed.get((tenant_name, key), 0)

    def freed_while_down(self, node_id: str, alloc_ids: set[int]) -> None:
        self._freed_while_down[node_id] = alloc_ids

    def refused_for(self, node_id: str) -> set[int]:
        return self._freed_while_down.get(node_id, set())

    def node_reported(self, node_id: str) -> None:
        """Every segment of the node has reported: nothing of its past is left to refuse."""
        self._freed_while_down.pop(node_id, None)
