"""One public call's figures for the client metrics, gathered the same way by both faces.

A face wraps each metered call (op = get | put | exists | prefix_len) in a `Meter`: it adds the
time every `Rpc` took (lookup), every `Move` (load), and the whole call (wait), and the flow
reports what it did with a `Record` effect (keys, hits, bytes, late keys). The figures go to
`cellar.client.metrics` (sdk-buffers' recorder) once per call: a call that finished, or that
raised after its keys were settled (a `get` miss is NotFound, and still a request that missed),
is a request; one that raised before is an error of its exception's class.
"""

from __future__ import annotations

import time

from cellar.client import metrics
from cellar.client.flows import Move, Record, Rpc


class Meter:
    __slots__ = ("op", "record", "_lookup_s", "_load_s", "_started")

    def __init__(self, op: str) -> None:
        assert op in metrics.OPS, op
        self.op = op
        self.record: Record | None = None
        self._lookup_s = 0.0
        self._load_s = 0.0
        self._started = time.perf_counter()

    def spent(self, effect: object, seconds: float) -> None:
        if isinstance(effect, Rpc):
            self._lookup_s += seconds
        elif isinstance(effect, Move):
            self._load_s += seconds

    def finish(self, error: BaseException | None = None) -> None:
        rec = self.record
        if rec is None:
            if error is not None:
                metrics.record_error(self.op, error)
            return
        metrics.record_request(
            self.op, keys=rec.keys, hits=rec.hits, nbytes=rec.nbytes,
            lookup_s=self._lookup_s, load_s=self._load_s if self._load_s else None,
            wait_s=time.perf_counter() - self._started, late_deadline=rec.late)
