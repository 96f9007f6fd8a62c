"""Placement: which segment (and offset) each replica of a new object goes to.

Policy, per replica:
- replicas of one object go to distinct nodes; nodes the writer asked to avoid (it just failed
  to reach them) and nodes that are not ACTIVE get nothing;
- the first replica goes to the writer's preferred host when one of its segments has room
  (same-host readers and writers then use shared memory);
- otherwise "power of k choices": sample `placement_choices` candidate segments and try them
  freest first, where freest means the highest free fraction times the node's ramp weight.
  A node that joins nodes already holding data (`Node.ramps`, set by membership.py at mount)
  has its weight grow linearly from 2% to 100% over `new_node_ramp_s`, so an empty newcomer
  does not take a whole write burst; it still takes writes when others are full. Nodes that
  mount together into an empty cluster are all "new": none ramps, free space alone decides.
  With few segments every candidate is scored (deterministic, exact "freest first").
- if no sampled segment has room, every eligible segment is tried, freest first;
- with a disk tier, a replica no DRAM segment has room for goes to a disk with room
  (`fallback`: `Tiers.spill`), still on a node of its own.

Returns the (segment, offset) list or None when there is no room anywhere eligible; on None
nothing stays allocated. This module never evicts (the service does, then calls again) and
never decides whether a node is alive (membership.py does).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection

from cellar.master.state.membership import Membership
from cellar.master.state.records import Segment

MIN_RAMP_WEIGHT = 0.02
NO_NODES: frozenset[str] = frozenset()
# Where a replica goes when no DRAM segment has room: (size, nodes to avoid) -> spot or None
Fallback = Callable[[int, Collection[str]], "tuple[Segment, int] | None"]


class Placement:
    def __init__(self, membership: Membership, *, choices: int, ramp_s: float, rng: random.Random) -> None:
        self.membership = membership
        self.choices = choices
        self.ramp_s = ramp_s
        self._rng = rng

    def score(self, segment: Segment, now: float) -> float:
        """Free fraction of the segment times its node's ramp weight (higher is better)."""
        free = segment.allocator.free_bytes / segment.size_bytes
        node = segment.node
        if node.ramps and now < node.joined_at + self.ramp_s:
            return free * max(MIN_RAMP_WEIGHT, (now - node.joined_at) / self.ramp_s)
        return free

    def place(
        self,
        size: int,
        replicas: int,
        avoid: Collection[str],
        preferred_host: str,
        now: float,
        fallback: Fallback | None = None,
    ) -> list[tuple[Segment, int]] | None:
        """With `fallback` (a disk tier's spill), a replica no DRAM segment has room for goes
        where it says, on a node this object has no other replica on."""
        if replicas == 1 and not avoid and not preferred_host:  # the common case, kept lean
            spot = self.place_one(size, NO_NODES, now)
            if spot is None and fallback is not None:
                spot = fallback(size, NO_NODES)
            return None if spot is None else [spot]
        chosen: list[tuple[Segment, int]] = []
        used_nodes: set[str] = set(avoid)
        for index in range(replicas):
            spot = None
            if index == 0 and preferred_host:
                spot = self._on_host(size, preferred_host, used_nodes, now)
            if spot is None:
                spot = self.place_one(size, used_nodes, now)
            if spot is None and fallback is not None:
                spot = fallback(size, used_nodes)
            if spot is None:
                for segment, offset in chosen:  # never handed out: no grant, free at once
                    segment.allocator.free(offset)
                return None
            chosen.append(spot)
            used_nodes.add(spot[0].node.node_id)
        return chosen

    def _on_host(self, size: int, host: str, used_nodes: Collection[str], now: float) -> tuple[Segment, int] | None:
        segments = [s for s in self.membership.by_host.get(host, ()) if s.node.node_id not in used_nodes]
        segments.sort(key=lambda s: self.score(s, now), reverse=True)
        return self._first_fit(segments, size)

    def place_one(self, size: int, used_nodes: Collection[str], now: float) -> tuple[Segment, int] | None:
        """One replica on a node not in `used_nodes`; `place` of one replica with nothing to
        avoid and no preferred host is exactly `place_one(size, NO_NODES, now)`."""
        active = self.membership.active_segments
        count = len(active)
        if count == 0:
            return None
        if count <= 2 * self.choices:
            # Few segments: score them all; the freest usually has room, so no sort.
            best: Segment | None = None
            best_score = -1.0
            score_of = self.score  # inlining it saved nothing measurable (<2% of a PutStart key)
            for segment in active:
                if segment.node.node_id in used_nodes:
                    continue
                score = score_of(segment, now)
                if score > best_score:
                    best, best_score = segment, score
            if best is None:
                return None
            offset = best.allocator.alloc(size)
            if offset is not None:
                return best, offset
            candidates = [s for s in active if s.node.node_id not in used_nodes and s is not best]
            candidates.sort(key=lambda s: self.score(s, now), reverse=True)
            return self._first_fit(candidates, size)
        picks: dict[int, Segment] = {}
        rand = self._rng.random
        for _ in range(4 * self.choices):
            segment = active[int(rand() * count)]
            if segment.node.node_id not in used_nodes:
                picks[segment.segment_id] = segment
                if len(picks) >= self.choices:
                    break
        sampled = sorted(picks.values(), key=lambda s: self.score(s, now), reverse=True)
        spot = self._first_fit(sampled, size)
        if spot is not None:
            return spot
        # Space is short: try every eligible segment, freest first.
        rest = [s for s in active if s.node.node_id not in used_nodes and s.segment_id not in picks]
        rest.sort(key=lambda s: self.score(s, now), reverse=True)
        return self._first_fit(rest, size)

    @staticmethod
    def _first_fit(segments: list[Segment], size: int) -> tuple[Segment, int] | None:
        for segment in segments:
            offset = segment.allocator.alloc(size)
            if offset is not None:
                return segment, offset
        return None
