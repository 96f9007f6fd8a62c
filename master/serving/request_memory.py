"""RequestMemory: the replies of mutating calls, remembered by request id (issue 19, finding 4).

What it owns
    A bounded table (token id, tenant, client id, request id) -> (method, reply, when) for the
    RPCs of `cellar.proto.request_id.MUTATING_METHODS`. Both lines (gRPC and the fast line) run
    every body through `once`, so a call whose first reply was lost and that is carried again,
    on the same line or the other, gets the first call's reply instead of running twice (a
    second PutStart would find its own key WRITING: ALREADY_EXISTS; a second Remove NOT_FOUND).

The invariant
    A request id answers at most one execution of one method for one identity: a repeat with
    the same method gets the same reply object; a repeat with another method is refused
    (INVALID_ARGUMENT, nothing changes). The token id is part of the key, so nobody can be
    handed the reply (and the grants in it) of a call another token made. A call that raised
    (a whole-request refusal) is not remembered: it changed nothing, so running it again is
    the first call's result.

Bounds (master settings, each enforced on insert; oldest forgotten first)
    `request_id_memory_entries` replies, `request_id_memory_bytes` of their estimated sizes
    (REPLY_BYTES + RESULT_BYTES per key result),
    and `request_id_memory_s` seconds of age. A repeat later than that runs again. Entries are
    in insertion order, which is age order, so trimming is O(1) per forgotten entry.

What it never does
    It never decides anything about metadata and is not durable: after a master restart or a
    failover the new leader has no memory of the old one's ids. What a repeat then finds is
    written in docs/architecture.md ("Request ids"). One repeat is answered across them: a
    Remove's, by the tag (`request_tag`) its bounds carry in the durable removal log
    (master/removals.py), since "NOT_FOUND" for a remove that took effect reads as a lost key.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cellar.master.requests import RequestRejected
from cellar.master.state.read_trust import ReadTrust
from cellar.proto.request_id import MUTATING_METHODS

Key = tuple[str, str, str, int]
# A reply's size as the bytes bound counts it: an estimate, since an exact `ByteSize()` costs
# ~10 us for a 64-key PutStart reply (a fifth of the master's work for it). A one-replica key
# result with its grant serializes to ~110 bytes; the estimate leaves room for two replicas.
REPLY_BYTES = 128
RESULT_BYTES = 256


def request_tag(request: Any, token_id: str) -> str:
    """A fixed-size name of one call for the durable removal log ('' without a request id):
    a hash of the same identity `RequestMemory` keys replies by, so only the same token's
    repeat of the same call matches it, and no identity is written to etcd or disk."""
    header = request.header
    if not header.request_id:
        return ""
    name = f"{token_id}\0{header.tenant}\0{header.client_id}\0{header.request_id}"
    return hashlib.blake2b(name.encode(), digest_size=16).hexdigest()


class RequestMemory:
    def __init__(self, max_entries: int, max_age_s: float, max_bytes: int, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert max_entries >= 0 and max_age_s > 0 and max_bytes >= 0, (max_entries, max_age_s)
        self.max_entries = max_entries
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._clock = clock
        # (method, reply, when, size, until when its acknowledgement waits (read_trust.py))
        self._replies: OrderedDict[Key, tuple[str, Any, float, int, float]] = OrderedDict()
        self.bytes = 0
        self.repeats = 0    # calls answered from memory
        self.forgotten = 0  # entries dropped by a bound
        self._owner: object = None

    def __len__(self) -> int:
        return len(self._replies)

    def collector(self) -> Collector:
        """master_request_ids_remembered{,_bytes}, master_request_repeats_total and
        master_request_ids_forgotten_total (by a bound)."""
        return _Figures(self)

    def serve(self, owner: object) -> None:
        """Forget everything when the service answering changed (a new term: its replies
        carry another epoch, and its tables are not the ones the old replies described)."""
        if owner is not self._owner:
            self._owner = owner
            self._replies.clear()
            self.bytes = 0

    def once(self, method: str, request: Any, token_id: str, run: Callable[[], Any],
             trust: ReadTrust | None = None) -> Any:
        """`run()`'s reply, or the reply of the first call with this request's id. With
        `trust`: a repeat's reply waits as long as the first call's (it may come while the
        first still waits: its acknowledgement must not come sooner)."""
        header = request.header
        request_id = header.request_id
        if not request_id or method not in MUTATING_METHODS or not self.max_entries:
            return run()
        key = (token_id, header.tenant, header.client_id, request_id)
        now = self._clock()
        self._trim(now)
        hit = self._replies.get(key)
        if hit is not None:
            if hit[0] != method:
                raise RequestRejected(f"request_id {request_id} already named a {hit[0]} call "
                                      f"of this client; use a new id per call")
            self.repeats += 1
            if trust is not None and hit[4] > trust.settle_until:
                trust.settle_until = hit[4]
            return hit[1]
        reply = run()
        size = REPLY_BYTES + RESULT_BYTES * len(getattr(reply, "results", ()))
        self._replies[key] = (method, reply, now, size,
                              0.0 if trust is None else trust.settle_until)
        self.bytes += size
        self._trim(now)
        assert len(self._replies) <= self.max_entries and self.bytes >= 0
        return reply

    def _trim(self, now: float) -> None:
        replies = self._replies
        oldest_kept = now - self.max_age_s
        while replies:
            _method, _reply, when, size, _settle = next(iter(replies.values()))
            if (when >= oldest_kept and len(replies) <= self.max_entries
                    and self.bytes <= self.max_bytes):
                return
            replies.popitem(last=False)
            self.bytes -= size
            self.forgotten += 1


class _Figures(Collector):
    def __init__(self, memory: RequestMemory) -> None:
        self._memory = memory

    def collect(self) -> Iterator[Metric]:
        m = self._memory
        yield GaugeMetricFamily("master_request_ids_remembered", "replies of mutating calls "
                                "remembered by request id", value=len(m))
        yield GaugeMetricFamily("master_request_ids_remembered_bytes", "their estimated size",
                                value=m.bytes)
        yield CounterMetricFamily("master_request_repeats", "calls carried twice, answered with "
                                  "the first call's reply", value=m.repeats)
        yield CounterMetricFamily("master_request_ids_forgotten", "remembered replies dropped by "
                                  "a bound (count, bytes or age)", value=m.forgotten)


__all__ = ["RequestMemory", "request_tag"]
