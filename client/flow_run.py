"""Stepping one flow for a face, and the call's figures for the client metrics.

`FlowRun` is everything a face's loop does except the waiting: hand the flow the last answer
(or exception), take its next effect, keep `Record` effects and the time each effect took. A
face is then

    run = FlowRun(flow, op)
    while (effect := run.next()) is not None:
        started = time.perf_counter()
        try:
            run.answer(self._perform(effect), started)    # `await self._perform(...)` in asyncio
        except BaseException as exc:
            run.fail(exc, started)
    return run.result

Metrics (op = get | put | exists | prefix_len, `cellar.client.metrics`, sdk-buffers' recorder):
lookup = the time of every `Rpc` (and `RpcAndMove`: a lookup with early reads beside it), load
= of every `Move`, wait = the whole call; keys, hits,
bytes, keys found but not used (late, refused, cut by a prefix) and tokens per key come from
the flow's `Record`. A call that finished, or that raised after
its keys were settled (a `get` miss is NotFound, and still a request that missed), counts as a
request; one that raised before counts as an error of its exception's class.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any, Generic, TypeVar

from cellar.client import metrics
from cellar.client.flows import Effect, Move, Record, Rpc, RpcAndMove
from cellar.client.load_costs import LoadCosts

T = TypeVar("T")


class FlowRun(Generic[T]):
    __slots__ = ("result", "_costs", "_error", "_flow", "_last", "_load_s", "_lookup_s", "_op",
                 "_record", "_send", "_started")

    def __init__(self, flow: Generator[Effect, Any, T], op: str | None,
                 costs: LoadCosts | None = None) -> None:
        assert op is None or op in metrics.OPS, op
        self._flow = flow
        self._op = op
        self._costs = costs
        self._record: Record | None = None
        self._send: Any = None
        self._error: BaseException | None = None
        self._lookup_s = 0.0
        self._load_s = 0.0
        self._started = time.perf_counter()
        self._last: Effect | None = None
        self.result: T

    def next(self) -> Effect | None:
        """The next effect to perform, or None once the flow returned (`result`); raises what
        the flow raised."""
        while True:
            error, self._error = self._error, None
            send, self._send = self._send, None
            try:
                effect = self._flow.throw(error) if error is not None else self._flow.send(send)
            except StopIteration as stop:
                self.result = stop.value
                self._finish(None)
                return None
            except BaseException as exc:
                self._finish(exc)
                raise
            if not isinstance(effect, Record):
                self._last = effect
                return effect
            self._record = effect

    def answer(self, value: Any, started: float) -> None:
        self._send = value
        self._spent(started)

    def fail(self, error: BaseException, started: float) -> None:
        self._error = error  # handed to the flow, which re-raises what it does not handle
        self._spent(started)

    def _spent(self, started: float) -> None:
        last = self._last
        spent = time.perf_counter() - started
        if isinstance(last, Rpc):
            self._lookup_s += spent
            if self._costs is not None:
                self._costs.rpc(last.method, spent)
        elif isinstance(last, Move):
            self._load_s += spent
            if self._costs is not None and last.round.kind == "read":
                _record_read(self._costs, last, spent)
        elif isinstance(last, RpcAndMove):  # a lookup with early reads beside it: its wait
            self._lookup_s += spent
            if self._costs is not None and last.move.round.kind == "read":
                # the bytes read early arrived within the pair's time (an upper bound on the
                # read's own): a client whose gets all read early still learns its throughput
                _record_read(self._costs, last.move, spent)

    def _finish(self, error: BaseException | None) -> None:
        if self._op is None:
            return
        rec = self._record
        if rec is None:
            if error is not None:
                metrics.record_error(self._op, error)
            return
        wait_s = time.perf_counter() - self._started
        metrics.record_request(
            self._op, keys=rec.keys, hits=rec.hits, nbytes=rec.nbytes,
            lookup_s=self._lookup_s, load_s=self._load_s if self._load_s else None,
            wait_s=wait_s, late_deadline=rec.late, refused=rec.refused, cut=rec.cut,
            tokens_per_key=rec.tokens_per_key)
        if self._op == "get" and self._costs is not None and error is None:
            self._costs.load(rec.nbytes, wait_s)


def _record_read(costs: LoadCosts, move: Move, seconds: float) -> None:
    """One read round for the load estimate (client/load_costs.py): the bytes that arrived,
    under the transport that carried most of them."""
    rnd = move.round
    best, best_bytes, total = "", -1, 0
    for transport, indexes in rnd.groups:
        moved = 0
        for i in indexes:
            result = rnd.results[i]
            if result is None or not result.ok:
                continue
            op = rnd.ops[i]
            moved += sum(len(p) for p in op.parts) if op.parts else len(op.buffer)
        total += moved
        if moved > best_bytes:
            best, best_bytes = str(getattr(transport, "name", "")), moved
    costs.read(best, total, seconds)
