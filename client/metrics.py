"""Client cache metrics, as an engine's operators read them (Prometheus).

What it owns
    `REGISTRY`, a `prometheus_client.CollectorRegistry` of its own (mount it in the
    application's exporter, e.g. `make_wsgi_app(REGISTRY)`, or expose it with
    `serve_metrics(port)`), the metric families below, and the small recorder API the SDK's
    faces call once per operation (`record_request`, `record_error`; `record_requests` for a
    batch of one-key calls answered together; `record_vanished` for a caller that probed keys,
    found them, and then could not read them). Nothing else writes them.

Names (label `op` = get | put | exists | prefix_len | lookup)
    cellar_client_requests_total{op}            requests
    cellar_client_request_hits_total{op}        requests whose every key hit
    cellar_client_keys_total{op}                keys asked for
    cellar_client_key_hits_total{op}            keys found (get: read; exists/prefix_len: present)
    cellar_client_bytes_total{op}               payload bytes moved
    cellar_client_request_bytes{op}             histogram: payload bytes per request
    cellar_client_unused_keys_total{op,reason}  keys found but not used: reason=deadline
                                                (not read within the call's budget), refused
                                                (found, but no replica could be read: node
                                                refused, transfer failed, checksum), prefix
                                                (found, but after a key that could not be read
                                                in a prefix-mode get) or vanished (a caller's
                                                probe found it, its get did not)
    cellar_client_tokens_total{op}              tokens asked for (keys x tokens_per_key)
    cellar_client_tokens_reused_total{op}       tokens of the keys that hit (get: loaded;
                                                exists/prefix_len/lookup: found)
    cellar_client_unused_tokens_total{op,reason} tokens of the unused keys, by the same reasons
    cellar_client_lookup_seconds{op}            histogram: metadata time (master round trips)
    cellar_client_load_seconds{op}              histogram: data-plane time (moving the bytes)
    cellar_client_wait_seconds{op}              histogram: the whole call as its caller waited
    cellar_client_errors_total{op,kind}         calls that raised, by exception class name
    cellar_client_early_reads_total{outcome}    gets' early reads (client/early_reads.py):
                                                outcome=kept (the reply confirmed the bytes)
                                                or discarded (the key was read again, or not);
                                                trusted (read without asking the master) or
                                                trusted_failed (then asked for)
    Hit ratios: key_hits_total / keys_total (by key), request_hits_total / requests_total (by
    request), tokens_reused_total / tokens_total (by token); by byte: bytes_total{op="get"} over
    what was asked (the caller knows its sizes). The token series count only the calls whose
    tokens per key are known: `lookup(..., tokens_per_key=)`, or the client's `tokens_per_key`
    (set once, as the engine adapters do: tokens per page object); a call without it adds 0.

Cost on the hot path: the series are plain numbers (one small lock per op), turned into
Prometheus families only when scraped (`_Collector`): one call is a lock and a handful of
additions, about a microsecond. The asyncio face's coalesced gets (64 callers answered by one
batch) record all their callers in one `record_requests` call: the same series as 64
`record_request` calls, for the price of one.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

OPS = ("get", "put", "exists", "prefix_len", "lookup")
UNUSED_REASONS = ("deadline", "refused", "prefix", "vanished")

REGISTRY = CollectorRegistry(auto_describe=True)

_SECONDS_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                    0.5, 1.0, 2.5, 5.0, 10.0)
_BYTES_BUCKETS = tuple(float(1 << k) for k in range(10, 34, 2))  # 1 KiB .. 8 GiB, x4

# (name, help) of the families; the counters' names carry `_total` on the wire.
_COUNTERS = (
    ("cellar_client_requests", "Client requests", "requests"),
    ("cellar_client_request_hits", "Requests whose every key hit", "request_hits"),
    ("cellar_client_keys", "Keys asked for", "keys"),
    ("cellar_client_key_hits", "Keys found", "key_hits"),
    ("cellar_client_bytes", "Payload bytes moved", "nbytes"),
    ("cellar_client_tokens", "Tokens asked for (calls whose tokens per key are known)",
     "tokens"),
    ("cellar_client_tokens_reused", "Tokens of the keys that hit", "tokens_reused"),
)
# (name, help, attribute) of the by-reason families (label `reason` in UNUSED_REASONS)
_UNUSED = (
    ("cellar_client_unused_keys", "Keys found but not used: not read within the budget "
     "(deadline), unreadable (refused), after an unreadable key in a prefix get (prefix), gone "
     "between a probe and the get (vanished)", "unused"),
    ("cellar_client_unused_tokens", "Tokens of the keys found but not used, by the same reasons",
     "unused_tokens"),
)
_HISTOGRAMS = (
    ("cellar_client_request_bytes", "Payload bytes per request", "request_bytes"),
    ("cellar_client_lookup_seconds", "Metadata time per request", "lookup"),
    ("cellar_client_load_seconds", "Data-plane time per request", "load"),
    ("cellar_client_wait_seconds", "Time the caller waited per request", "wait"),
)


class _Histogram:
    """Per-bucket counts (not cumulative) and the sum; the last bound is +Inf."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = (*bounds, float("inf"))
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def add(self, value: float, n: int = 1) -> None:
        # Prometheus's rule: an observation lands in the first bucket whose bound is >= it.
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            running += count
            out.append((floatToGoString(bound), running))
        return out


class _Series:
    """Every number of one op; `lock` guards them all (the sync face records from threads)."""

    __slots__ = ("lock", "requests", "request_hits", "keys", "key_hits", "nbytes", "tokens",
                 "tokens_reused", "unused", "unused_tokens", "request_bytes", "lookup", "load",
                 "wait")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = self.request_hits = self.keys = self.key_hits = self.nbytes = 0
        self.tokens = self.tokens_reused = 0
        self.unused = dict.fromkeys(UNUSED_REASONS, 0)
        self.unused_tokens = dict.fromkeys(UNUSED_REASONS, 0)
        self.request_bytes = _Histogram(_BYTES_BUCKETS)
        self.lookup = _Histogram(_SECONDS_BUCKETS)
        self.load = _Histogram(_SECONDS_BUCKETS)
        self.wait = _Histogram(_SECONDS_BUCKETS)


_SERIES = {op: _Series() for op in OPS}  # every series exists (at 0) from the start
_errors: dict[tuple[str, str], int] = {}
_errors_lock = threading.Lock()
EARLY_OUTCOMES = ("kept", "discarded", "trusted", "trusted_failed")
_early_reads = dict.fromkeys(EARLY_OUTCOMES, 0)  # guarded by _errors_lock
_enabled = True


class _Collector(Collector):
    """The families above, read from `_SERIES` at scrape time."""

    def collect(self) -> Iterator[Metric]:
        snapshot: dict[str, dict[str, Any]] = {}
        for op, series in _SERIES.items():
            with series.lock:
                snapshot[op] = {name: getattr(series, name) for _, _, name in _COUNTERS}
                for _, _, name in _UNUSED:
                    snapshot[op][name] = dict(getattr(series, name))
                for _, _, name in _HISTOGRAMS:
                    hist = getattr(series, name)
                    snapshot[op][name] = (hist.buckets(), hist.total)
        for family_name, doc, name in _COUNTERS:
            counter = CounterMetricFamily(family_name, doc, labels=["op"])
            for op in OPS:
                counter.add_metric([op], snapshot[op][name])
            yield counter
        for family_name, doc, name in _UNUSED:
            unused = CounterMetricFamily(family_name, doc, labels=["op", "reason"])
            for op in OPS:
                for reason in UNUSED_REASONS:
                    unused.add_metric([op, reason], snapshot[op][name][reason])
            yield unused
        for family_name, doc, name in _HISTOGRAMS:
            histogram = HistogramMetricFamily(family_name, doc, labels=["op"])
            for op in OPS:
                buckets, total = snapshot[op][name]
                histogram.add_metric([op], buckets, total)
            yield histogram
        errors = CounterMetricFamily("cellar_client_errors", "Calls that raised, by exception "
                                     "class", labels=["op", "kind"])
        with _errors_lock:
            for (op, kind), count in sorted(_errors.items()):
                errors.add_metric([op, kind], count)
            early = dict(_early_reads)
        yield errors
        early_reads = CounterMetricFamily("cellar_client_early_reads", "Gets' early reads "
                                          "(under a kept grant, beside the lookup or, within "
                                          "the master's read trust, instead of it), by outcome",
                                          labels=["outcome"])
        for outcome in EARLY_OUTCOMES:
            early_reads.add_metric([outcome], early[outcome])
        yield early_reads


REGISTRY.register(_Collector())


def set_enabled(enabled: bool) -> None:
    """Turn recording on or off for this process (on by default)."""
    global _enabled
    _enabled = bool(enabled)


def _series(op: str) -> _Series:
    series = _SERIES.get(op)
    if series is None:
        raise ValueError(f"unknown op {op!r}; one of {', '.join(OPS)}")
    return series


def record_request(op: str, *, keys: int, hits: int, nbytes: int = 0,
                   lookup_s: float | None = None, load_s: float | None = None,
                   wait_s: float | None = None, late_deadline: int = 0,
                   late_vanished: int = 0, refused: int = 0, cut: int = 0,
                   tokens_per_key: int | None = None) -> None:
    """One finished call of `op` over `keys` keys of which `hits` hit, moving `nbytes` payload
    bytes; the phase times that apply; keys found but not used, by reason (late_deadline,
    late_vanished, refused, cut = prefix); with `tokens_per_key`, the same in tokens."""
    if not _enabled:
        return
    c = _series(op)
    assert 0 <= hits <= keys, "hits must lie in [0, keys]"
    unused = late_deadline + refused + cut + late_vanished
    assert min(late_deadline, refused, cut, late_vanished) >= 0 and hits + unused <= keys, \
        "hits and unused keys must not exceed the keys asked"
    with c.lock:
        c.requests += 1
        c.request_hits += hits == keys
        c.keys += keys
        c.key_hits += hits
        c.nbytes += nbytes
        c.request_bytes.add(nbytes)
        if lookup_s is not None:
            c.lookup.add(lookup_s)
        if load_s is not None:
            c.load.add(load_s)
        if wait_s is not None:
            c.wait.add(wait_s)
        if tokens_per_key:
            c.tokens += keys * tokens_per_key
            c.tokens_reused += hits * tokens_per_key
        if unused:  # the common call leaves none: skip the per-reason work
            for reason, n in (("deadline", late_deadline), ("refused", refused),
                              ("prefix", cut), ("vanished", late_vanished)):
                if n:
                    c.unused[reason] += n
                    if tokens_per_key:
                        c.unused_tokens[reason] += n * tokens_per_key


def record_requests(op: str, nbytes: Sequence[int | None], *,
                    wait_s: float | None = None, tokens_per_key: int | None = None) -> None:
    """len(nbytes) finished one-key calls of `op` answered together: each hit moving its
    `nbytes[i]` payload bytes, or missed (None); each caller waited `wait_s`. The same series
    as one `record_request(op, keys=1, ...)` per caller."""
    if not _enabled or not nbytes:
        return
    c = _series(op)
    hit_sizes = [n for n in nbytes if n is not None]
    misses = len(nbytes) - len(hit_sizes)
    with c.lock:
        c.requests += len(nbytes)
        c.request_hits += len(hit_sizes)
        c.keys += len(nbytes)
        c.key_hits += len(hit_sizes)
        c.nbytes += sum(hit_sizes)
        if misses:
            c.request_bytes.add(0, misses)
        if len(set(hit_sizes)) == 1:  # the common case: pages of one size
            c.request_bytes.add(hit_sizes[0], len(hit_sizes))
        else:
            for n in hit_sizes:
                c.request_bytes.add(n)
        if wait_s is not None:
            c.wait.add(wait_s, len(nbytes))
        if tokens_per_key:
            c.tokens += len(nbytes) * tokens_per_key
            c.tokens_reused += len(hit_sizes) * tokens_per_key


def record_vanished(op: str, keys: int, tokens_per_key: int | None = None) -> None:
    """`keys` keys that the caller's own probe (exists, prefix_len, lookup) found and its
    following `op` call did not (evicted or removed in between): unused, reason=vanished. The
    SDK cannot tell this from an ordinary miss; a caller that probes then reads can."""
    if not _enabled or keys <= 0:
        return
    c = _series(op)
    with c.lock:
        c.unused["vanished"] += keys
        if tokens_per_key:
            c.unused_tokens["vanished"] += keys * tokens_per_key


def record_error(op: str, error: BaseException | str) -> None:
    """A call of `op` that raised; `kind` is the exception's class name (e.g. Unavailable)."""
    if not _enabled:
        return
    _series(op)
    kind = error if isinstance(error, str) else type(error).__name__
    with _errors_lock:
        _errors[op, kind] = _errors.get((op, kind), 0) + 1


def record_trusted_reads(kept: int, failed: int) -> None:
    """A get batch's trusted reads: `kept` read without asking, `failed` then asked for."""
    _count_reads((("trusted", kept), ("trusted_failed", failed)))


def record_early_reads(kept: int, discarded: int) -> None:
    """A get batch's early reads: `kept` confirmed by the reply, `discarded` not."""
    _count_reads((("kept", kept), ("discarded", discarded)))


def _count_reads(counts: tuple[tuple[str, int], ...]) -> None:
    if not _enabled or not any(n for _, n in counts):
        return
    with _errors_lock:
        for outcome, n in counts:
            _early_reads[outcome] += n


_server_lock = threading.Lock()
_servers: list[Any] = []


def serve_metrics(port: int, host: str = "127.0.0.1") -> int:
    """Serve REGISTRY at http://host:port/metrics from a daemon thread; returns the bound port
    (pass 0 for a free one). Loopback by default: expose it wider on purpose."""
    with _server_lock:
        server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
        _servers.append(server)
    return int(server.server_port)


def stop_metrics_servers() -> None:
    """Stop every server `serve_metrics` started (tests; an application may just exit)."""
    with _server_lock:
        servers, _servers[:] = list(_servers), []
    for server in servers:
        server.shutdown()
        server.server_close()
