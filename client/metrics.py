"""Client cache metrics, as an engine's operators read them (Prometheus).

What it owns
    `REGISTRY`, a `prometheus_client.CollectorRegistry` of its own (mount it in the
    application's exporter, e.g. `make_wsgi_app(REGISTRY)`, or expose it with
    `serve_metrics(port)`), the metric families below, and the small recorder API the SDK's
    faces call once per operation (`record_request`, `record_error`). Nothing else writes them.

Names (label `op` = get | put | exists | prefix_len)
    cellar_client_requests_total{op}            requests
    cellar_client_request_hits_total{op}        requests whose every key hit
    cellar_client_keys_total{op}                keys asked for
    cellar_client_key_hits_total{op}            keys found (get: read; exists/prefix_len: present)
    cellar_client_bytes_total{op}               payload bytes moved
    cellar_client_request_bytes{op}             histogram: payload bytes per request
    cellar_client_late_keys_total{op,reason}    keys found but not read in time:
                                                reason=deadline (the budget ran out) or
                                                vanished (gone between exists and get)
    cellar_client_lookup_seconds{op}            histogram: metadata time (master round trips)
    cellar_client_load_seconds{op}              histogram: data-plane time (moving the bytes)
    cellar_client_wait_seconds{op}              histogram: the whole call as its caller waited
    cellar_client_errors_total{op,kind}         calls that raised, by exception class name
    Hit ratios: key_hits_total / keys_total (by key), request_hits_total / requests_total (by
    request); by byte: bytes_total{op="get"} over what was asked (the caller knows its sizes).

Cost on the hot path: one dict lookup for the op's pre-bound children, then a handful of
counter increments and up to three histogram observations (each a short lock in
prometheus_client): a few microseconds per call, not per key.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

OPS = ("get", "put", "exists", "prefix_len")
LATE_REASONS = ("deadline", "vanished")

REGISTRY = CollectorRegistry(auto_describe=True)

_SECONDS_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                    0.5, 1.0, 2.5, 5.0, 10.0)
_BYTES_BUCKETS = tuple(float(1 << k) for k in range(10, 34, 2))  # 1 KiB .. 8 GiB, x4

REQUESTS = Counter("cellar_client_requests_total", "Client requests", ["op"], registry=REGISTRY)
REQUEST_HITS = Counter("cellar_client_request_hits_total", "Requests whose every key hit",
                       ["op"], registry=REGISTRY)
KEYS = Counter("cellar_client_keys_total", "Keys asked for", ["op"], registry=REGISTRY)
KEY_HITS = Counter("cellar_client_key_hits_total", "Keys found", ["op"], registry=REGISTRY)
BYTES = Counter("cellar_client_bytes_total", "Payload bytes moved", ["op"], registry=REGISTRY)
REQUEST_BYTES = Histogram("cellar_client_request_bytes", "Payload bytes per request", ["op"],
                          buckets=_BYTES_BUCKETS, registry=REGISTRY)
LATE_KEYS = Counter("cellar_client_late_keys_total",
                    "Keys found but not read in time (deadline) or gone before the read "
                    "(vanished)", ["op", "reason"], registry=REGISTRY)
LOOKUP_SECONDS = Histogram("cellar_client_lookup_seconds", "Metadata time per request",
                           ["op"], buckets=_SECONDS_BUCKETS, registry=REGISTRY)
LOAD_SECONDS = Histogram("cellar_client_load_seconds", "Data-plane time per request", ["op"],
                         buckets=_SECONDS_BUCKETS, registry=REGISTRY)
WAIT_SECONDS = Histogram("cellar_client_wait_seconds", "Time the caller waited per request",
                         ["op"], buckets=_SECONDS_BUCKETS, registry=REGISTRY)
ERRORS = Counter("cellar_client_errors_total", "Calls that raised, by exception class",
                 ["op", "kind"], registry=REGISTRY)


@dataclass(slots=True, frozen=True)
class _Children:
    requests: Counter
    request_hits: Counter
    keys: Counter
    key_hits: Counter
    nbytes: Counter
    request_bytes: Histogram
    lookup: Histogram
    load: Histogram
    wait: Histogram
    late: Mapping[str, Counter]


def _bind(op: str) -> _Children:
    return _Children(REQUESTS.labels(op), REQUEST_HITS.labels(op), KEYS.labels(op),
                     KEY_HITS.labels(op), BYTES.labels(op), REQUEST_BYTES.labels(op),
                     LOOKUP_SECONDS.labels(op), LOAD_SECONDS.labels(op), WAIT_SECONDS.labels(op),
                     {r: LATE_KEYS.labels(op, r) for r in LATE_REASONS})


_CHILDREN = {op: _bind(op) for op in OPS}  # every series exists (at 0) from the start
_enabled = True


def set_enabled(enabled: bool) -> None:
    """Turn recording on or off for this process (on by default)."""
    global _enabled
    _enabled = bool(enabled)


def record_request(op: str, *, keys: int, hits: int, nbytes: int = 0,
                   lookup_s: float | None = None, load_s: float | None = None,
                   wait_s: float | None = None, late_deadline: int = 0,
                   late_vanished: int = 0) -> None:
    """One finished call of `op` over `keys` keys of which `hits` hit, moving `nbytes` payload
    bytes; the phase times that apply; keys found but not read in time, by reason."""
    if not _enabled:
        return
    c = _CHILDREN.get(op)
    if c is None:
        raise ValueError(f"unknown op {op!r}; one of {', '.join(OPS)}")
    assert 0 <= hits <= keys, "hits must lie in [0, keys]"
    c.requests.inc()
    if hits == keys:
        c.request_hits.inc()
    if keys:
        c.keys.inc(keys)
    if hits:
        c.key_hits.inc(hits)
    if nbytes:
        c.nbytes.inc(nbytes)
    c.request_bytes.observe(nbytes)
    if lookup_s is not None:
        c.lookup.observe(lookup_s)
    if load_s is not None:
        c.load.observe(load_s)
    if wait_s is not None:
        c.wait.observe(wait_s)
    if late_deadline:
        c.late["deadline"].inc(late_deadline)
    if late_vanished:
        c.late["vanished"].inc(late_vanished)


def record_error(op: str, error: BaseException | str) -> None:
    """A call of `op` that raised; `kind` is the exception's class name (e.g. Unavailable)."""
    if not _enabled:
        return
    if op not in _CHILDREN:
        raise ValueError(f"unknown op {op!r}; one of {', '.join(OPS)}")
    kind = error if isinstance(error, str) else type(error).__name__
    ERRORS.labels(op, kind).inc()


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
