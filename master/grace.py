"""Rebuild grace: when a miss may only mean "not reported yet".

After a master starts, objects come back through the nodes' index reports (master/node_rpcs.py).
Until the table is whole, a miss (GetReplicas, Exists, PrefixLen, Remove) answers gRPC
UNAVAILABLE, which clients retry within their deadline, instead of NOT_FOUND. The table may be
incomplete while (a) a segment's report is still incomplete, or (b) less than `rebuild_grace_s`
passed since this master started and either no node has mounted yet or a node said it was
mounted before (an earlier epoch, or a report follows). A first mount of a fresh node, with no
such sign, ends (b) at once, so a brand-new cluster answers misses right away; so does the
return of every node the previous leader had mounted (HA takeover).

It holds flags and times only; it never touches the object table.
"""

from __future__ import annotations

from cellar.master.requests import RequestRejected


class RebuildGrace:
    def __init__(self, started_at: float, grace_s: float) -> None:
        self.started_at = started_at
        self.grace_s = grace_s
        self.restart_evidence = False
        self.fresh_mount_seen = False
        self.over = False
        # Nodes the previous leader had mounted (HA takeover, cellar.master.serving.leadership): once
        # all of them have mounted here and reported, nothing is missing and the grace ends.
        self.expected_nodes: frozenset[str] | None = None

    def on_mount(self, report_follows: bool, previous_epoch: int, epoch: int) -> None:
        if report_follows or (previous_epoch and previous_epoch != epoch):
            self.restart_evidence = True
        elif not self.restart_evidence:
            self.fresh_mount_seen = True

    def recovering(self, rebuilding_segments: int, mounted: dict[str, object], now: float) -> bool:
        """Whether a miss may be an object not reported yet."""
        return bool(rebuilding_segments) or self.starting(rebuilding_segments, mounted, now)

    def starting(self, rebuilding_segments: int, mounted: dict[str, object], now: float) -> bool:
        """Whether this master's own start may still be missing reports (a segment's report
        in progress alone does not count: a node that restarts later is not the master's
        start). Rebuild raises an object's kept replica count (`Obj.wanted`) only then.

        The grace ends for good once it has run `grace_s`, or once every node of the previous
        leader has mounted here and no segment is still reporting. It must not end while one
        is: adopting the second replica of an object then left its count at one, and the
        repair queue dropped that replica as surplus (make soak-ha: acknowledged puts lost
        when the node of the one replica left expired)."""
        if self.over:
            return False
        if now - self.started_at >= self.grace_s:
            self.over = True
            return False
        expected = self.expected_nodes
        if expected is not None and expected.issubset(mounted):
            if rebuilding_segments:
                return True  # all back, not all reported yet
            self.over = True  # every node of the previous leader is back and reported
            return False
        return self.restart_evidence or not self.fresh_mount_seen

    @staticmethod
    def error() -> RequestRejected:
        return RequestRejected(
            "the master is rebuilding its table from the storage nodes' reports; retry shortly",
            code="UNAVAILABLE",
        )
