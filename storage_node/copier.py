"""Copier: this node's side of re-replication and drain, one copy order at a time.

What it owns: the copies the master ordered in heartbeat replies (proto CopyTask, signed by the
master in master/repair.py), running on the node's event loop, at most MAX_COPIES_IN_FLIGHT at
once, and the reports (proto CopyDone) waiting for the next heartbeat.

One copy, told as a story: the master placed a new replica of an object in this node's segment
and signed two grants, a read grant on a surviving replica of another node (the source) and a
write grant on the new range here. The copier
1. opens the target range exactly as a client's WRITE would (`NodeAccess.writable`: the write
   grant is authentic, current, unexpired, its key tag is the tenant and key the order names,
   and the index admits the allocation), so an order is only as good as its grant;
2. reads the source over the data plane (tcp, `cellar.transfer.tcp_async`; a `tls://` data
   port over TLS, verified against the CA the node trusts for its master) with the read grant,
   straight into that range of segment memory (no staging copy), with the xxh3 computed as
   the bytes land;
3. seals the allocation (`NodeAccess.written`, journal flushed) only when the xxh3 equals the
   object's checksum; otherwise it reports the failure and leaves the allocation unsealed (the
   master frees it and this node drops it from its index at the freed notice). An allocation
   the index dropped meanwhile (freed, or a remount) is not sealed either: a failure too;
4. reports (alloc id, segment, offset, length, checksum, status) in the next heartbeat. The
   master adds the replica only if those are exactly the allocation it granted.
The source keeps serving readers meanwhile: a copy is one more grant-checked read.

A copy's bytes land only while its master still owns the range for it (the late-write rule,
as for tier moves in disk_tier.py). From `writable` to its end the copy holds its target in
flight (storage_node/inflight.py), so a tcp write or CLAIM of a newer allocation there is
refused ST_BUSY; but a shm or rdma writer the master did not flag to claim copies into the
range without asking this node, and its COMMIT is admitted once the copy has ended. So a
copy belongs to the mount it was ordered under: `begin_mount` (before every mount, before the
index is reported; the next master treats what the report lacks as free) cancels every running
copy and waits until each has released its range (the transport writes nothing into a view
once its read returned), and forgets their reports (nobody waits for them). And a copy's read
ends by its write grant's expiry (the node's clock, as the data server cuts its transfers):
the master hands an abandoned target out again after that expiry and `grant_skew_s`.

Pacing is the master's (`repair_bytes_per_s`: it hands out orders at that rate per source and
per target); this module bounds what it holds: MAX_COPIES_IN_FLIGHT copies, MAX_DONE_KEPT
reports. Every field of an order is checked (lengths against the segment, the grant by
NodeAccess) before memory is touched. It never talks to the master itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from xxhash import xxh3_64_intdigest

from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import Grant
from cellar.storage_node.access import NodeAccess
from cellar.transfer.base import AsyncTransport, Discard, SegmentRoute, TransferOp
from cellar.transfer.frame import OP_WRITE, FrameError, RequestHeader, WriteMeta

log = logging.getLogger("cellar.node.copier")

MAX_COPIES_IN_FLIGHT = 64     # copies running at once on this node
MAX_DONE_KEPT = 4096          # reports kept for the next heartbeats (oldest dropped beyond)
MAX_DONE_PER_HEARTBEAT = 1024  # reports one heartbeat carries (the master's max_batch_keys)
COPY_TIMEOUT_S = 30.0         # one copy's read at most; its write grant's expiry sooner
MAX_ADDRESS_CHARS = 4096


class CopyFailed(Exception):
    pass


def _grant(g: Any, segment_id: int, offset: int, length: int) -> Grant:
    return Grant(int(g.op), segment_id, offset, length, int(g.alloc_id), int(g.epoch),
                 int(g.expiry_ms), int(g.key_tag), bytes(g.mac))


class Copier:
    def __init__(self, access: NodeAccess,
                 transport_factory: Callable[[], AsyncTransport] | None = None, *,
                 tls_ca_file: str | None = None) -> None:
        """`tls_ca_file`: the CA a source's `tls://` data port is verified against (the one
        this node verifies its master with: nodes' data-port certificates come from the
        cluster's CA as clients assume, connect_args.tls_ca_for); None: the system's trust
        store. A copy never falls back to plaintext."""
        self._access = access
        self._factory = transport_factory or (lambda: _tcp_transport(tls_ca_file))
        self._transport: AsyncTransport | None = None
        self._running: dict[int, asyncio.Task[None]] = {}
        self._done: list[pb.CopyDone] = []
        self.copies_ok = 0
        self.copies_failed = 0
        self.bytes_copied = 0
        self.orders_refused = 0
        self.copies_stale = 0  # cancelled by a mount: ordered by a master no longer served

    def start(self, orders: Sequence[Any]) -> None:
        """Start the copies of one heartbeat reply (on the running loop)."""
        for order in orders:
            alloc_id = int(order.alloc_id)
            if alloc_id in self._running:
                continue  # the same order again (a reply delivered twice)
            if len(self._running) >= MAX_COPIES_IN_FLIGHT:
                self.orders_refused += 1
                self._report(order, 0, pb.UNAVAILABLE, "copier busy")
                continue
            task = asyncio.create_task(self._copy(order), name=f"cellar-copy-{alloc_id}")
            self._running[alloc_id] = task
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        for alloc_id, running in list(self._running.items()):
            if running is task:
                del self._running[alloc_id]

    async def begin_mount(self, timeout_s: float) -> bool:
        """A mount is about to start: cancel the copies an earlier mount's master ordered and
        forget their reports (module docstring). False if one has not released its range
        within `timeout_s` (the mount is tried again later)."""
        running = list(self._running.values())
        self.copies_stale += sum(task.cancel() for task in running)
        self._done.clear()
        if not running:
            return True
        _, pending = await asyncio.wait(running, timeout=timeout_s)
        return not pending

    def take_done(self) -> list[pb.CopyDone]:
        out, self._done = self._done[:MAX_DONE_PER_HEARTBEAT], self._done[MAX_DONE_PER_HEARTBEAT:]
        return out

    def requeue(self, done: list[pb.CopyDone]) -> None:
        """The heartbeat carrying these failed: send them with the next one."""
        self._done[:0] = done
        del self._done[MAX_DONE_KEPT:]

    async def aclose(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        if self._transport is not None:
            await self._transport.aclose()
            self._transport = None

    def status(self) -> dict[str, int]:
        return {"copies_running": len(self._running), "copies_ok": self.copies_ok,
                "copies_failed": self.copies_failed, "copies_stale": self.copies_stale,
                "bytes_copied": self.bytes_copied}

    # ---- one copy ----------------------------------------------------------------------

    async def _copy(self, order: Any) -> None:
        try:
            checksum, receipt = await self._run(order)
        except CopyFailed as exc:
            self.copies_failed += 1
            log.warning("copy of allocation %d from %s failed: %s", order.alloc_id,
                        order.source_node_id, exc)
            self._report(order, 0, pb.INTERNAL, str(exc))
            return
        self.copies_ok += 1
        self.bytes_copied += int(order.length)
        self._report(order, checksum, pb.OK, "", receipt)

    async def _run(self, order: Any) -> tuple[int, bytes]:
        length = int(order.length)
        address = str(order.source_address)
        if length <= 0 or not address or len(address) > MAX_ADDRESS_CHARS:
            raise CopyFailed("an order without a length or a source address")
        target = RequestHeader(OP_WRITE, 0, int(order.target_segment_id), int(order.target_offset),
                               length, grant=_grant(order.target_grant, int(order.target_segment_id),
                                                    int(order.target_offset), length))
        meta = WriteMeta(int(order.checksum), length, str(order.tenant), str(order.key))
        try:
            view = self._access.writable(target, meta)  # every check of a client's WRITE
        except FrameError as exc:
            raise CopyFailed(f"target range refused: {exc}") from None
        try:  # held in flight from here (storage_node/inflight.py): released in any case
            return await self._fill(order, target, meta, view)
        finally:
            self._access.release(target)

    async def _fill(self, order: Any, target: RequestHeader, meta: WriteMeta,
                    view: memoryview | Discard) -> tuple[int, bytes]:
        """Read the source into the admitted target `view`, check it and seal."""
        length = int(order.length)
        address = str(order.source_address)
        if isinstance(view, Discard):  # sealed by an earlier try of this order: its receipt
            return int(order.checksum), self._written(target, meta)
        # the bytes are the value of an older put: a rebuilt master orders the key's values by it
        self._access.index.set_value_id(int(order.alloc_id), int(order.value_alloc_id))
        if self._transport is None:
            self._transport = self._factory()
        route = SegmentRoute(int(order.source_segment_id), str(order.source_node_id), "",
                             {"tcp": address})
        source = TransferOp(route, _grant(order.source_grant, int(order.source_segment_id),
                                          int(order.source_offset), length),
                            int(order.source_offset), view, want_checksum=True)
        budget_s = min(COPY_TIMEOUT_S, self._access.time_left_s(target))
        if budget_s <= 0:  # as the data server: begun past its grant, it cannot end before it
            raise CopyFailed("the write grant expired before the read began")
        (result,) = await self._transport.read([source], budget_s)
        if not result.ok:
            raise CopyFailed(f"read from {address}: {result}")
        checksum = result.checksum if result.checksum is not None else xxh3_64_intdigest(view)
        if checksum != int(order.checksum):
            raise CopyFailed(f"checksum {checksum:#x} is not the object's {int(order.checksum):#x}")
        return checksum, self._written(target, meta)  # seals: every byte arrived

    def _written(self, target: RequestHeader, meta: WriteMeta) -> bytes:
        try:
            receipt = self._access.written(target, meta)
        except FrameError as exc:  # ST_BUSY: another write of the allocation in flight
            raise CopyFailed(f"not sealed: {exc}") from None
        if not receipt:  # the index no longer holds the allocation: the master freed it
            raise CopyFailed("not sealed: the allocation was freed while the copy ran")
        self._access.flush()
        return receipt

    def _report(self, order: Any, checksum: int, status: int, message: str,
                receipt: bytes = b"") -> None:
        self._done.append(pb.CopyDone(
            alloc_id=int(order.alloc_id), segment_id=int(order.target_segment_id),
            offset=int(order.target_offset), length=int(order.length), checksum=checksum,
            status=status, message=message[:256], receipt=receipt))  # type: ignore[arg-type]
        del self._done[:-MAX_DONE_KEPT]


def _tcp_transport(tls_ca_file: str | None) -> AsyncTransport:
    from cellar.transfer.tcp_async import AsyncTcpTransport
    from cellar.transfer.tls_sock import client_context

    return AsyncTcpTransport(connections_per_node=2, tls_context=client_context(tls_ca_file))
