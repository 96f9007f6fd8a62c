"""Find the current leader (and the live masters) of a Cellar cluster through etcd.

Used by clients, nodes and the CLI: a plain, thread-safe, synchronous reader (an asyncio caller
runs it in a worker thread). It reads the keys `cellar.coord.target` describes over etcd's
gRPC KV API, trying the endpoints in turn, and never writes. Reads are linearizable (etcd's
default), so a leader it returns was the leader when etcd answered; fencing by epoch (nodes and
clients refuse older epochs) covers the time after that.

`leader()` returns None when no master currently holds the leadership (an election is under
way); it raises `cellar.Unavailable` when no etcd endpoint answered within the timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc

from cellar.coord.etcd_tls import EtcdTls
from cellar.coord.target import EtcdTarget, LeaderRecord
from cellar.errors import Unavailable

log = logging.getLogger("cellar.coord")

DEFAULT_TIMEOUT_S = 2.0
MAX_MASTERS_LISTED = 64


def _etcd_protocol() -> tuple[Any, Any]:
    """etcd's generated KV stub and RangeRequest, shipped by etcd3aio (imported lazily so that
    embedded clusters never load it)."""
    from etcd3aio._protobuf import KVStub, RangeRequest

    return KVStub, RangeRequest


def _range_end(prefix: bytes) -> bytes:
    """The first key after every key starting with `prefix` (etcd's prefix-range convention)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


class LeaderDiscovery:
    """Reads `/cellar/<cluster>/leader` (and `masters/`) from etcd; keeps one channel open."""

    def __init__(self, target: EtcdTarget) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._next = 0
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._endpoint = ""

    def _stub_for(self, endpoint: str) -> Any:
        if self._endpoint != endpoint or self._stub is None:
            if self._channel is not None:
                self._channel.close()
            kv_stub, _ = _etcd_protocol()
            tls = EtcdTls.from_env()  # coord/etcd_tls.py: TLS when configured, never a fallback
            options = [("grpc.enable_retries", 0)]
            self._channel = (grpc.insecure_channel(endpoint, options=options) if tls is None else
                             grpc.secure_channel(endpoint, tls.credentials(),
                                                 options=options + tls.channel_options()))
            self._stub = kv_stub(self._channel)
            self._endpoint = endpoint
        return self._stub

    def _range(self, key: bytes, range_end: bytes, timeout_s: float) -> Any:
        """One Range call, endpoint after endpoint until one answers or the time is up."""
        _, range_request = _etcd_protocol()
        request = range_request(key=key, range_end=range_end, limit=MAX_MASTERS_LISTED)
        deadline = time.monotonic() + timeout_s
        endpoints = self.target.endpoints
        last = "no endpoint tried"
        with self._lock:
            attempt = 0
            while True:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    break
                endpoint = endpoints[(self._next + attempt) % len(endpoints)]
                try:
                    reply = self._stub_for(endpoint).Range(
                        request, timeout=min(remaining_s, max(0.2, timeout_s / len(endpoints))))
                    self._next = (self._next + attempt) % len(endpoints)
                    return reply
                except grpc.RpcError as exc:
                    code = exc.code() if hasattr(exc, "code") else None
                    last = f"{endpoint}: {code.name if code else exc}"
                    attempt += 1
                    if attempt % len(endpoints) == 0:
                        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        raise Unavailable(f"etcd unreachable for cluster {self.target.cluster!r} ({last})")

    def leader(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> LeaderRecord | None:
        reply = self._range(self.target.leader_key.encode(), b"", timeout_s)
        for kv in reply.kvs:
            try:
                return LeaderRecord.from_json(kv.value)
            except ValueError as exc:
                log.warning("ignoring a malformed leader record in etcd: %s", exc)
        return None

    def wait_for_leader(self, timeout_s: float) -> LeaderRecord:
        """Poll until some master leads; `cellar.Unavailable` when none did within timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_s = deadline - time.monotonic()
            try:
                record = self.leader(max(0.05, min(DEFAULT_TIMEOUT_S, remaining_s)))
            except Unavailable:
                if time.monotonic() >= deadline:
                    raise
                record = None
            if record is not None:
                return record
            if time.monotonic() >= deadline:
                raise Unavailable(f"cluster {self.target.cluster!r} has no leader in etcd "
                                  f"(waited {timeout_s:.3g} s)")
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def masters(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[LeaderRecord]:
        """Every live master that registered itself (leader and standbys), by id."""
        prefix = self.target.masters_prefix.encode()
        reply = self._range(prefix, _range_end(prefix), timeout_s)
        out = []
        for kv in reply.kvs:
            try:
                out.append(LeaderRecord.from_json(kv.value))
            except ValueError:
                continue
        return sorted(out, key=lambda r: r.master_id)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = None
            self._stub = None
            self._endpoint = ""
