"""The rdma transport: one-sided RDMA READ/WRITE between client buffers and node segments.

Only where pyverbs and an RDMA device exist; everything here talks to `verbs.Device`, so it is
unit-tested on a fake device (tests/unit/test_rdma_transport.py) and runs on real hardware
through `verbs.PyverbsDevice` (tests/integration/test_rdma_device.py, skipped without one).

Keys: a node with a device registers each segment as a memory region with remote read/write
access and advertises, per segment, an Endpoint(transport="rdma", address, extra) where extra
is `SegmentKey.pack()` (rkey, base address, size, and the segment file's st_dev/st_ino) and
address is "<device>/<port>/<gid hex>/<extra hex>": the SDK's routes keep endpoint addresses
only, so the address carries the key too, and `parse_endpoint` reads it from there.

Connections: one RC queue pair per node, set up on first use by an RDMA_CONNECT control frame
on the node's TCP port (meta: our `QpInfo`; reply payload: the node's; the grant of one of the
batch's ops on that node, which the node checks before it opens a queue pair), so no side
channel and no extra port. `forget(route)` closes it; the next batch connects again.

A batch: every op is checked (grant covers the range, range inside the segment, a write has
its meta and the node a tcp endpoint), its buffer is found in (or added to) the MR cache, and
it is cut into chunks of at most `chunk_bytes`; chunks are posted as signalled READ/WRITE work
requests, at most `max_outstanding` per queue pair, and completions are polled until every
chunk completed or the deadline passed. A failed completion fails its op and breaks its queue
pair (RC: everything behind it is flushed), which is closed; a timeout fails what is left with
ST_TIMEOUT. Writes whose chunks all completed are then COMMITted exactly like shm writes
(control.ControlChannel, one pipelined round trip per node): the node checks the grant and
records the range; a refused commit fails the op.

Why one-sided writes before the check are acceptable: the rkey of a segment lets its holder
write the whole segment, like the shm file does on one host; rkeys reach only clients the
master gave segment descriptors to. The COMMIT keeps the node's index and the sealing rule as
truthful as for TCP writes. (Per-grant memory windows would close that gap; not built.)

The MR cache registers a client buffer once and reuses it for any op inside it (an
`alloc_buffer` buffer is registered on first use, then never again). It keeps a reference to
every registered buffer, so the memory cannot be freed and its address reused while the NIC
still maps the old pages; it is bounded by count and bytes (least recently used goes first).
Batches run one at a time per transport (a lock): simple, and one queue pair per node already
keeps the NIC busy.

It never posts a work request for a range its grant does not cover or past the segment.
"""

from __future__ import annotations

import collections
import ssl
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cellar.transfer import verbs
from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_CONNECTION_LOST,
    ST_TIMEOUT,
    SegmentRoute,
    TransferOp,
    TransferResult,
    Transport,
    op_nbytes,
    op_views,
)
from cellar.transfer.control import ControlCall, ControlChannel
from cellar.transfer.frame import (
    OP_CLAIM,
    OP_COMMIT,
    OP_RDMA_CONNECT,
    ST_BAD_FRAME,
    ST_BAD_GRANT,
    ST_EXPIRED,
    ST_INTERNAL,
    ST_OK,
    ST_OUT_OF_RANGE,
    ST_STALE_EPOCH,
    ST_UNSUPPORTED,
    FrameError,
    pack_commit_meta,
)
from cellar.transfer.shm import buffer_address
from cellar.transfer.verbs import OPCODE_READ, OPCODE_WRITE, RdmaUnavailable, VerbsError

DEFAULT_CHUNK_BYTES = 4 << 20
DEFAULT_MAX_OUTSTANDING = 64        # signalled work requests in flight per queue pair
DEFAULT_MR_CACHE_REGIONS = 256
DEFAULT_MR_CACHE_BYTES = 64 << 30
POLL_SLICE_S = 0.01                 # longest single wait in poll when several peers are busy
# A queue pair is connected under one op's grant; when the node refuses that grant as such,
# at most this many ops' grants are tried before the batch's ops on that node fail.
CONNECT_GRANT_TRIES = 3
GRANT_REFUSALS = frozenset({ST_BAD_GRANT, ST_EXPIRED, ST_STALE_EPOCH, ST_OUT_OF_RANGE})

# rkey, base address, size, file dev, file ino
_SEGMENT_KEY = struct.Struct("<IQQQQ")

__all__ = ["RdmaTransport", "RdmaUnavailable", "SegmentKey", "format_endpoint",
           "parse_endpoint"]


@dataclass(frozen=True, slots=True)
class SegmentKey:
    """What a client needs to address a node's segment with one-sided verbs."""

    rkey: int
    base: int
    size: int
    file_dev: int = 0
    file_ino: int = 0

    def pack(self) -> bytes:
        return _SEGMENT_KEY.pack(self.rkey, self.base, self.size, self.file_dev, self.file_ino)

    @classmethod
    def unpack(cls, raw: bytes) -> SegmentKey:
        if len(raw) != _SEGMENT_KEY.size:
            raise ValueError(f"segment key of {len(raw)} bytes, want {_SEGMENT_KEY.size}")
        return cls(*_SEGMENT_KEY.unpack(raw))


def format_endpoint(device: str, port: int, gid: bytes, key: SegmentKey) -> tuple[str, bytes]:
    """(address, extra) of a segment's rdma Endpoint."""
    if "/" in device:
        raise ValueError(f"device name {device!r} contains '/'")
    extra = key.pack()
    return f"{device}/{port}/{gid.hex()}/{extra.hex()}", extra


def parse_endpoint(address: str) -> tuple[str, SegmentKey]:
    """(device, key) from an rdma endpoint address; ValueError if malformed."""
    parts = address.split("/")
    if len(parts) != 4 or not parts[0] or not parts[1].isdigit():
        raise ValueError(f"bad rdma endpoint {address!r}")
    return parts[0], SegmentKey.unpack(bytes.fromhex(parts[3]))


class MrCache:
    """Registered client buffers, reused for any range inside them; LRU, bounded."""

    def __init__(self, device: verbs.Device, *, max_regions: int = DEFAULT_MR_CACHE_REGIONS,
                 max_bytes: int = DEFAULT_MR_CACHE_BYTES) -> None:
        if max_regions < 1 or max_bytes < 1:
            raise ValueError("max_regions and max_bytes must be >= 1")
        self.device = device
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        # (addr, length, writable) -> (region, the registered buffer, kept alive)
        self._regions: collections.OrderedDict[tuple[int, int, bool],
                                               tuple[verbs.MemoryRegion, memoryview]] = \
            collections.OrderedDict()
        self._bytes = 0
        self.registrations = 0
        self.hits = 0

    def lookup(self, view: memoryview, *, writable: bool) -> tuple[verbs.MemoryRegion, int]:
        """(region, address of view's first byte) for a flat byte view; registers on a miss.
        Raises VerbsError if registration fails."""
        addr, n = buffer_address(view), len(view)
        for key in reversed(self._regions):  # most recent first
            base, length, w = key
            if base <= addr and addr + n <= base + length and (w or not writable):
                self._regions.move_to_end(key)
                self.hits += 1
                return self._regions[key][0], addr
        region = self.device.register(view, remote_write=False)
        self.registrations += 1
        key = (addr, n, not view.readonly)  # a writable buffer serves reads and writes
        self._regions[key] = (region, view)
        self._bytes += n
        while len(self._regions) > 1 and (len(self._regions) > self.max_regions
                                          or self._bytes > self.max_bytes):
            self._drop(next(iter(self._regions)))
        return region, addr

    def _drop(self, key: tuple[int, int, bool]) -> None:
        region, _view = self._regions.pop(key)
        self._bytes -= key[1]
        try:
            region.close()
        except VerbsError:
            pass

    def __len__(self) -> int:
        return len(self._regions)

    def close(self) -> None:
        for key in list(self._regions):
            self._drop(key)


class _Peer:
    """One node's queue pair."""

    def __init__(self, address: str, qp: verbs.QueuePair) -> None:
        self.address = address
        self.qp = qp
        self.broken = False
        self.outstanding = 0


# A chunk: (op index, local address, length, lkey, remote address, rkey)
_Chunk = tuple[int, int, int, int, int, int]


class RdmaTransport(Transport):
    """One-sided transfers over RC queue pairs; thread-safe (one batch at a time).

    device: a `verbs.Device` (tests pass a fake); default `verbs.open_device(device_name)`,
        which raises `RdmaUnavailable` on a machine without pyverbs or a device.
    chunk_bytes: largest single work request; max_outstanding: work requests in flight per
        queue pair. `stats`: connects, chunks, ops, bytes, commits refused, broken queue pairs.
    """

    name = "rdma"

    def __init__(self, *, device: verbs.Device | None = None, device_name: str | None = None,
                 control: ControlChannel | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
                 mr_cache_regions: int = DEFAULT_MR_CACHE_REGIONS,
                 mr_cache_bytes: int = DEFAULT_MR_CACHE_BYTES,
                 connect_timeout_s: float = 5.0,
                 tls_context: ssl.SSLContext | None = None) -> None:
        if chunk_bytes < 1 or max_outstanding < 1:
            raise ValueError("chunk_bytes and max_outstanding must be >= 1")
        self._device = device if device is not None else verbs.open_device(device_name)
        self.chunk_bytes = chunk_bytes
        self.max_outstanding = max_outstanding
        # the setup and COMMIT line: over TLS to a node whose tcp endpoint is `tls://`
        self._control = control or ControlChannel(connect_timeout_s=connect_timeout_s,
                                                  tls_context=tls_context)
        self._mrs = MrCache(self._device, max_regions=mr_cache_regions, max_bytes=mr_cache_bytes)
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer] = {}
        self._parsed: dict[str, SegmentKey | None] = {}
        self._next_wr = 1
        self._closed = False
        self.stats: dict[str, int] = {"connects": 0, "chunks": 0, "reads": 0, "writes": 0,
                                      "bytes_read": 0, "bytes_written": 0, "commits_refused": 0,
                                      "claims_refused": 0,
                                      "broken_qps": 0}

    # -- Transport -------------------------------------------------------------------------

    def can_reach(self, route: SegmentRoute) -> bool:
        address = route.endpoints.get(self.name)
        return bool(address) and bool(route.endpoints.get("tcp")) \
            and self._key(address) is not None

    def forget(self, route: SegmentRoute) -> None:
        tcp = route.endpoints.get("tcp")
        if not tcp:
            return
        with self._lock:
            peer = self._peers.pop(tcp, None)
            if peer is not None:
                peer.qp.close()
        self._control.forget(tcp)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            peers, self._peers = list(self._peers.values()), {}
            for peer in peers:
                peer.qp.close()
            self._mrs.close()
        self._control.close()

    def read(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        return self._batch(ops, timeout_s, writing=False)

    def write(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        return self._batch(ops, timeout_s, writing=True)

    # -- a batch ---------------------------------------------------------------------------

    def _batch(self, ops: Sequence[TransferOp], timeout_s: float, *,
               writing: bool) -> list[TransferResult]:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if self._closed:
                return [TransferResult(ST_CONNECT_FAILED, "transport closed") for _ in ops]
            results = [TransferResult() for _ in ops]
            keys: list[SegmentKey | None] = [None] * len(ops)
            by_peer: dict[str, list[_Chunk]] = {}
            for i, op in enumerate(ops):
                planned = self._plan(op, writing)
                if isinstance(planned, TransferResult):
                    results[i] = planned
                    continue
                tcp, key, chunks = planned
                keys[i] = key
                by_peer.setdefault(tcp, []).extend((i,) + c for c in chunks)
            if writing:  # claimed before any byte lands (shm_commits.WritePlan says why)
                self.stats["claims_refused"] += self._control_round(
                    OP_CLAIM, ops, keys, results, deadline)
                by_peer = {tcp: kept for tcp, chunks in by_peer.items()
                           if (kept := [c for c in chunks if results[c[0]].ok])}
            peers: dict[str, _Peer] = {}
            for tcp, chunks in by_peer.items():
                peer = self._peer(tcp, deadline, (ops[c[0]] for c in chunks))
                if isinstance(peer, TransferResult):
                    _fail(results, chunks, peer)
                else:
                    peers[tcp] = peer
            self._move(peers, by_peer, results, deadline, writing)
            for tcp, peer in peers.items():
                if peer.broken:
                    self.stats["broken_qps"] += 1
                    self._peers.pop(tcp, None)
                    peer.qp.close()
        if writing:
            refused = self._control_round(OP_COMMIT, ops, keys, results, deadline)
            with self._lock:
                self.stats["commits_refused"] += refused
        with self._lock:
            done = [(op, r) for op, r in zip(ops, results, strict=True) if r.ok]
            kind = "writes" if writing else "reads"
            self.stats[kind] += len(done)
            self.stats["bytes_written" if writing else "bytes_read"] += sum(
                op_nbytes(op) for op, _ in done)
        return results

    def _plan(self, op: TransferOp, writing: bool
              ) -> TransferResult | tuple[str, SegmentKey, list[tuple[int, int, int, int, int]]]:
        route = op.route
        address, tcp = route.endpoints.get(self.name), route.endpoints.get("tcp")
        key = self._key(address) if address else None
        if key is None or not tcp:
            return TransferResult(ST_UNSUPPORTED, f"segment {route.segment_id} of node "
                                  f"{route.node_id} has no usable rdma and tcp endpoints")
        try:
            views = op_views(op, writable=not writing)
        except (ValueError, TypeError) as e:
            return TransferResult(ST_UNSUPPORTED, f"buffer: {e}")
        n, grant = sum(len(v) for v in views), op.grant
        if not grant.covers(route.segment_id, op.offset, n):
            return TransferResult(ST_OUT_OF_RANGE, f"[{op.offset}, +{n}) is outside the grant "
                                  f"[{grant.offset}, +{grant.length})")
        if op.offset < 0 or op.offset + n > key.size:
            return TransferResult(ST_OUT_OF_RANGE, f"[{op.offset}, +{n}) is outside segment "
                                  f"{route.segment_id} ({key.size} bytes)")
        if writing and op.meta is None:
            return TransferResult(ST_BAD_FRAME, "a write needs its WriteMeta")
        chunks = []
        remote = key.base + op.offset
        for view in views:  # scatter-gather: each part is its own local range, one MR each
            part_bytes = len(view)
            if not part_bytes:
                continue
            try:
                region, addr = self._mrs.lookup(view, writable=not writing)
            except VerbsError as e:
                return TransferResult(ST_INTERNAL, f"cannot register the buffer: {e}")
            for pos in range(0, part_bytes, self.chunk_bytes):
                length = min(self.chunk_bytes, part_bytes - pos)
                chunks.append((addr + pos, length, region.lkey, remote + pos, key.rkey))
            remote += part_bytes
        return tcp, key, chunks

    def _key(self, address: str) -> SegmentKey | None:
        if address not in self._parsed:
            try:
                _device, key = parse_endpoint(address)
            except ValueError:
                key = None
            if len(self._parsed) > 65536:
                self._parsed.clear()
            self._parsed[address] = key
        return self._parsed[address]

    def _peer(self, tcp: str, deadline: float,
              ops: Iterable[TransferOp]) -> _Peer | TransferResult:
        """The connected queue pair to the node at `tcp`, connecting it if needed under the
        grant of one of `ops` (the node opens queue pairs only for a granted peer): the next
        op's, up to CONNECT_GRANT_TRIES, while the node refuses a grant as such."""
        peer = self._peers.get(tcp)
        if peer is not None:
            return peer
        try:
            qp = self._device.create_qp()
        except VerbsError as e:
            return TransferResult(ST_CONNECT_FAILED, f"{tcp}: create_qp: {e}")
        tried: set[int] = set()
        for op in ops:
            grant = op.grant
            if grant.alloc_id in tried:
                continue  # the chunks of one op
            tried.add(grant.alloc_id)
            call = ControlCall(OP_RDMA_CONNECT, grant, op.route.segment_id, grant.offset,
                               grant.length, qp.info.pack())
            reply = self._control.call({tcp: [call]},
                                       max(0.0, deadline - time.monotonic()))[tcp][0]
            if reply.status in GRANT_REFUSALS and len(tried) < CONNECT_GRANT_TRIES:
                continue  # this op's grant (forged, expired): another op's may do
            try:
                if reply.status != ST_OK:
                    raise VerbsError(reply.message or f"status {reply.status}")
                qp.connect(verbs.QpInfo.unpack(reply.payload))
            except VerbsError as e:
                qp.close()
                return TransferResult(ST_CONNECT_FAILED, f"{tcp}: rdma connect: {e}")
            peer = self._peers[tcp] = _Peer(tcp, qp)
            self.stats["connects"] += 1
            return peer
        qp.close()
        return TransferResult(ST_CONNECT_FAILED, f"{tcp}: rdma connect: no grant of the batch "
                              "was taken")

    def _move(self, peers: dict[str, _Peer], by_peer: dict[str, list[_Chunk]],
              results: list[TransferResult], deadline: float, writing: bool) -> None:
        """Post every peer's chunks (bounded in flight) and poll until all completed."""
        opcode = OPCODE_WRITE if writing else OPCODE_READ
        queues = {tcp: collections.deque(by_peer[tcp]) for tcp in peers}
        in_flight: dict[int, tuple[int, _Peer]] = {}  # wr_id -> (op index, peer)
        while True:
            busy = [p for p in peers.values() if not p.broken and (queues[p.address]
                                                                   or p.outstanding)]
            if not busy:
                break
            for peer in busy:  # post up to the window
                queue = queues[peer.address]
                while queue and peer.outstanding < self.max_outstanding and not peer.broken:
                    op_i, laddr, length, lkey, raddr, rkey = queue.popleft()
                    if not results[op_i].ok:
                        continue  # an earlier chunk of this op failed: skip the rest
                    wr_id = self._next_wr
                    self._next_wr += 1
                    try:
                        peer.qp.post(wr_id, opcode, laddr, length, lkey, raddr, rkey)
                    except VerbsError as e:
                        results[op_i] = TransferResult(ST_CONNECTION_LOST, f"{peer.address}: {e}")
                        peer.broken = True
                        break
                    in_flight[wr_id] = (op_i, peer)
                    peer.outstanding += 1
                    self.stats["chunks"] += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waiting = [p for p in busy if p.outstanding and not p.broken]
            slice_s = remaining if len(waiting) <= 1 else min(remaining, POLL_SLICE_S)
            for peer in waiting:
                try:
                    completions = peer.qp.poll(peer.outstanding, slice_s)
                except VerbsError as e:
                    peer.broken = True
                    _fail_peer(results, in_flight, peer, ST_CONNECTION_LOST, f"{peer.address}: {e}")
                    continue
                for c in completions:
                    entry = in_flight.pop(c.wr_id, None)
                    if entry is None:
                        continue  # not ours (a stale completion of an abandoned batch)
                    op_i, _ = entry
                    peer.outstanding -= 1
                    if not c.ok:
                        peer.broken = True  # RC: the queue pair is in the error state now
                        if results[op_i].ok:
                            results[op_i] = TransferResult(ST_CONNECTION_LOST, f"{peer.address}: "
                                                           f"work request failed: {c.status}")
        # whatever is left: timed out, or behind a broken queue pair
        for tcp, peer in peers.items():
            status, why = ((ST_CONNECTION_LOST, f"{tcp}: queue pair broken") if peer.broken
                           else (ST_TIMEOUT, f"{tcp}: timed out"))
            if peer.outstanding:
                peer.broken = True  # completions may still arrive: never reuse this QP
            _fail_peer(results, in_flight, peer, status, why)
            for chunk in queues[tcp]:
                if results[chunk[0]].ok:
                    results[chunk[0]] = TransferResult(status, why)

    def _control_round(self, op_code: int, ops: Sequence[TransferOp],
                       keys: list[SegmentKey | None], results: list[TransferResult],
                       deadline: float) -> int:
        """A CLAIM (before the writes, for the ops the master flagged: `TransferOp.claim`) or
        COMMIT (after them) per op still OK, pipelined per node; a refused one fails its op (a
        COMMIT's receipt goes into its result). Returns how many were refused."""
        calls: dict[str, list[ControlCall]] = {}
        which: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            key = keys[i]
            if not results[i].ok or key is None or op.meta is None:
                continue
            if op_code == OP_CLAIM and not op.claim:
                continue
            tcp = op.route.endpoints["tcp"]
            try:
                meta = pack_commit_meta(op.meta, key.file_dev, key.file_ino)
            except FrameError as e:
                results[i] = TransferResult(e.status, e.message)
                continue
            calls.setdefault(tcp, []).append(ControlCall(
                op_code, op.grant, op.route.segment_id, op.offset, op_nbytes(op), meta))
            which.setdefault(tcp, []).append(i)
        if not calls:
            return 0
        replies = self._control.call(calls, max(0.0, deadline - time.monotonic()))
        refused = 0
        for tcp, indexes in which.items():
            for i, reply in zip(indexes, replies[tcp], strict=True):
                if reply.status == ST_OK:
                    if op_code == OP_COMMIT:
                        results[i].receipt = reply.payload
                else:
                    results[i] = TransferResult(reply.status, reply.message)
                    refused += 1
        return refused


def _fail(results: list[TransferResult], chunks: list[_Chunk], result: TransferResult) -> None:
    for chunk in chunks:
        if results[chunk[0]].ok:
            results[chunk[0]] = result


def _fail_peer(results: list[TransferResult], in_flight: dict[int, tuple[int, _Peer]],
               peer: _Peer, status: int, why: str) -> None:
    for wr_id in [w for w, (_, p) in in_flight.items() if p is peer]:
        op_i, _ = in_flight.pop(wr_id)
        if results[op_i].ok:
            results[op_i] = TransferResult(status, why)
