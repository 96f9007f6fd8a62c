"""NodeAccess: the storage node's `SegmentAccess`, the gate between the network and memory.

The transport server (tcp, and its COMMIT frames for shm and rdma) calls it from its connection
threads to turn a decoded request into a memoryview of segment memory. Before it returns a
view, every request passes, in this order:
1. the segment is one of this node's (ST_UNKNOWN_SEGMENT);
2. the grant is authentic (MAC with the cluster secret), for this op, from the current master
   epoch or newer, unexpired by the node's estimate of the master clock, and covers the
   requested range (ST_BAD_GRANT, ST_STALE_EPOCH, ST_EXPIRED, ST_OUT_OF_RANGE);
3. the range lies inside the segment (ST_OUT_OF_RANGE);
4. writes only: the key tag of the write meta (tenant, key) is the one the grant was signed
   for (ST_BAD_GRANT), the object fits the grant and the range lies inside the object
   (ST_OUT_OF_RANGE), and the index accepts the allocation: not sealed, not freed, same
   metadata as its first write (ST_SEALED, ST_BAD_GRANT).

5. reads only: the index still holds the grant's allocation SEALED at exactly the granted
   offset and size, under the tenant and key of the grant's key tag, and the grant was issued
   after this node's current mount (ST_BAD_GRANT, ST_EXPIRED). A read grant therefore proves
   the bytes are the reader's object, not merely that the range was once granted.

shm and rdma clients copy payloads into segment memory themselves and then send a COMMIT
(`commit`): it runs checks 1-4 exactly as for a WRITE, plus two: the grant carries the COMMIT
right (GRANT_FLAG_COMMIT, which the master sets only for identities with the shm right; a
COMMIT under any other grant is refused with ST_BAD_GRANT, whatever the transport), and the
segment file the client copied into is this node's current one (same st_dev/st_ino: a guard
against a restarted node, not a secret, since any local user can stat the file). Only then is
the range recorded.

Receipts (issue 19): the write or commit that completes an allocation seals it (`seal`) and
gets back a receipt (cellar.proto.receipt: a MAC under the cluster secret over alloc id,
segment, offset, length, epoch and the checksum received), which the data server returns in
the OK reply and the client hands to the master in PutEnd. `seal` is the one way to seal and
issue a receipt: another writer on this node (a node-to-node copy) calls it the same way.
A write of an allocation that is sealed already, under its own grant and describing exactly
the sealed object (a retried chunk whose reply, receipt included, was lost), is not refused:
its payload lands in a scratch buffer, never over the sealed bytes, and the OK reply carries
the allocation's receipt again (the same MAC), so the put does not fail for a lost reply.

Transfers in flight (storage_node/inflight.py says why): every write admitted by `writable` or
`receiver` and every read admitted by `readable` holds its allocation in the index until the
server calls `release`; `written` refuses (ST_BUSY, nothing recorded) to seal an allocation
while another write of it is held, and the index refuses (ST_BUSY) a newer allocation over a
range still held. `time_left_s` tells the server when the grant, and so the transfer, ends.

Invariant: no byte of segment memory is handed out for a request that failed any check, and
`written` is the only way an allocation's received ranges (and so its sealing) advance.
shm and rdma READS never reach this gate (the client maps or reads the memory itself): that
is why shm is offered only to identities trusted on the host (docs/security.md).
It never copies payload bytes itself and never blocks on the network; it is safe to call from
any number of threads (the index has its own lock, the clock is read-only here).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from cellar.proto.grant import (
    GRANT_FLAG_COMMIT,
    Grant,
    GrantRejected,
    GrantVerifier,
    any_key_tag,
    key_tag,
)
from cellar.proto.receipt import ReceiptSigner
from cellar.storage_node.clock import MasterClock
from cellar.storage_node.index import IndexEntry, ObjectIndex, ReadRefused, WriteRefused
from cellar.storage_node.segment import Segment
from cellar.transfer.base import Discard, FileRange
from cellar.transfer.frame import (
    OP_CLAIM,
    OP_COMMIT,
    OP_RDMA_CONNECT,
    OP_READ,
    OP_WRITE,
    ST_BAD_FRAME,
    ST_BAD_GRANT,
    ST_BUSY,
    ST_EXPIRED,
    ST_OUT_OF_RANGE,
    ST_SEALED,
    ST_STALE_EPOCH,
    ST_UNKNOWN_SEGMENT,
    ST_UNSUPPORTED,
    FrameError,
    RequestHeader,
    WriteMeta,
)

GRANT_STATUS = {
    GrantRejected.BAD_MAC: ST_BAD_GRANT,
    GrantRejected.WRONG_OP: ST_BAD_GRANT,
    GrantRejected.EXPIRED: ST_EXPIRED,
    GrantRejected.OUT_OF_RANGE: ST_OUT_OF_RANGE,
    GrantRejected.STALE_EPOCH: ST_STALE_EPOCH,
}
REFUSED_STATUS = {
    WriteRefused.SEALED: ST_SEALED,
    WriteRefused.FREED: ST_SEALED,  # the allocation takes no more writes, ever
    WriteRefused.CONFLICT: ST_BAD_GRANT,
    WriteRefused.BUSY: ST_BUSY,  # transfers in flight (storage_node/inflight.py): retry
}


class NodeAccess:
    """Implements `cellar.transfer.base.SegmentAccess` for this node's segments."""

    def __init__(
        self,
        segments: Mapping[int, Segment],
        index: ObjectIndex,
        secret: bytes,
        clock: MasterClock,
        *,
        allowed_skew_ms: int = 1000,
    ) -> None:
        self.segments = dict(segments)
        self.index = index
        self.clock = clock
        self._verifier = GrantVerifier(secret)
        self._receipts = ReceiptSigner(secret)
        self._allowed_skew_ms = allowed_skew_ms
        # shm/rdma COMMIT: (st_dev, st_ino) of each segment's file, the memory a commit names
        self._file_ids: dict[int, tuple[int, int]] = {}
        for sid, seg in self.segments.items():
            if seg.path is not None:
                st = os.stat(seg.path)
                self._file_ids[sid] = (st.st_dev, st.st_ino)
        # Set by storage_node/rdma.py when this node serves RDMA: client QP info -> node QP info.
        self.rdma_acceptor: Callable[[bytes], bytes] | None = None

    def writable(self, request: RequestHeader, meta: WriteMeta) -> memoryview | Discard:
        """The segment memory the write's payload goes to, held in flight until `release`
        (transfer/base.py SegmentAccess)."""
        segment = self._admit_write(request, meta)
        if segment is None:
            # A retried chunk of this very allocation (its reply, receipt and all, was lost):
            # its payload lands nowhere (the server drains it through a buffer of its own, so a
            # retry costs no allocation of its length), and `written` resends the receipt.
            return Discard(request.length)
        offset = request.offset  # inside the segment: _check made sure
        return segment.memory[offset:offset + request.length]

    def receiver(self, request: RequestHeader, meta: WriteMeta) -> memoryview | FileRange | Discard:
        """`writable` for the TCP data server: a disk-tier range comes back as its FileRange,
        received through a buffer and pwrite (FileRange says why); memory as `writable`."""
        segment = self.segments.get(request.segment_id)
        if segment is None or not segment.writes_through_file:
            return self.writable(request, meta)
        if self._admit_write(request, meta) is None:
            return Discard(request.length)  # as `writable` says
        return FileRange(segment.fd, request.offset, request.length)

    def release(self, request: RequestHeader) -> None:
        """The transfer `writable`/`receiver`/`readable` admitted for `request` is over."""
        assert request.grant is not None  # admitted: it had one
        self.index.release(request.grant.alloc_id)

    def time_left_s(self, request: RequestHeader) -> float:
        """Seconds until the grant of an admitted `request` expires, by the node's clock (as
        the grant check reads it): its transfer must be over by then (docs/security.md)."""
        assert request.grant is not None
        return (request.grant.expiry_ms - self.clock.now_ms()) / 1000.0

    def _admit_write(self, request: RequestHeader, meta: WriteMeta,
                     claim: bool = False) -> Segment | None:
        """Every check of a WRITE (grant, key tag, sizes, the index admits the range); the
        segment, or None for a retried chunk of an allocation this very write sealed. Either
        way the write is held in flight until `release`. With `claim` (a shm/rdma writer about
        to copy, OP_CLAIM) the index only drops the older entries the range overlaps (nothing
        held): the object is admitted, checksum and all, at its COMMIT."""
        segment, grant = self._check(request, OP_WRITE)
        # A put-ahead grant (proto/grant.py ANY_KEY) names the tenant only: the first write of
        # the allocation names the key (the index holds every later chunk to it), and the
        # receipt binds that key for the master.
        if (key_tag(meta.tenant, meta.key) != grant.key_tag
                and any_key_tag(meta.tenant) != grant.key_tag):
            raise FrameError(ST_BAD_GRANT, "the write's tenant/key is not the one the grant names")
        if meta.object_size > grant.length:
            raise FrameError(
                ST_OUT_OF_RANGE,
                f"object of {meta.object_size} bytes does not fit the grant of {grant.length}",
            )
        if request.offset + request.length > grant.offset + meta.object_size:
            raise FrameError(
                ST_OUT_OF_RANGE,
                f"[{request.offset}, +{request.length}) runs past the object's end "
                f"{grant.offset + meta.object_size}",
            )
        try:
            if claim:
                self.index.claim(alloc_id=grant.alloc_id, segment_id=segment.segment_id,
                                 object_offset=grant.offset, object_size=meta.object_size,
                                 grant_expiry_ms=grant.expiry_ms)
                return segment
            self.index.admit_write(
                alloc_id=grant.alloc_id,
                segment_id=segment.segment_id,
                object_offset=grant.offset,
                object_size=meta.object_size,
                tenant=meta.tenant,
                key=meta.key,
                checksum=meta.checksum,
                epoch=grant.epoch,
                grant_expiry_ms=grant.expiry_ms,
                hold=True,
            )
        except WriteRefused as exc:
            if exc.reason == WriteRefused.SEALED and self._own_sealed(grant, meta) is not None:
                self.index.hold(grant.alloc_id)  # released like any admitted write
                return None
            raise FrameError(REFUSED_STATUS[exc.reason], str(exc)) from None
        return segment

    def _own_sealed(self, grant: Grant, meta: WriteMeta) -> IndexEntry | None:
        """The sealed entry of the grant's allocation if it is exactly the object this write
        describes (range, tenant, key, checksum), else None."""
        entry = self.index.sealed(grant.alloc_id)
        if entry is None or (entry.segment_id, entry.offset, entry.length, entry.tenant,
                             entry.key, entry.checksum) != (
                grant.segment_id, grant.offset, meta.object_size, meta.tenant, meta.key,
                meta.checksum):
            return None
        return entry

    def written(self, request: RequestHeader, meta: WriteMeta) -> bytes:
        """Record the request's range as received; the receipt if it completed the
        allocation, else b""."""
        grant = request.grant
        assert grant is not None  # writable() accepted this request
        start = request.offset - grant.offset
        receipt = self.seal(grant.alloc_id, start, start + request.length, held=True)
        if not receipt:  # sealed before (a retried chunk, a lost reply): the same receipt again
            entry = self._own_sealed(grant, meta)
            if entry is not None:
                return self._receipt(entry)
        return receipt

    def seal(self, alloc_id: int, rel_start: int, rel_end: int, *, held: bool = False) -> bytes:
        """Bytes [rel_start, rel_end) of allocation `alloc_id` (admitted by `admit_write`)
        arrived; when that completes it, the index seals it and this returns its receipt (the
        one place a receipt is signed), else b"". Any writer on this node calls it; `held`:
        its write is held in flight (`writable`). ST_BUSY, nothing recorded, when this would
        seal while another write of the allocation is in flight."""
        try:
            entry = self.index.record_written(alloc_id, rel_start, rel_end, held=held)
        except WriteRefused as exc:
            raise FrameError(REFUSED_STATUS[exc.reason], str(exc)) from None
        return b"" if entry is None else self._receipt(entry)

    def _receipt(self, entry: IndexEntry) -> bytes:
        return self._receipts.sign(alloc_id=entry.alloc_id, segment_id=entry.segment_id,
                                   offset=entry.offset, length=entry.length, epoch=entry.epoch,
                                   key_tag=key_tag(entry.tenant, entry.key),
                                   checksum=entry.checksum)

    def commit(self, request: RequestHeader, meta: WriteMeta, file_dev: int,
               file_ino: int) -> bytes:
        """shm/rdma: the payload of [offset, +length) was copied into segment memory by the
        client itself; run exactly the WRITE checks (grant, range, key tag, not sealed), then
        record the range as written. Refused with ST_UNKNOWN_SEGMENT when the client copied
        into another file than this node's current one (the node restarted, file replaced)."""
        if request.op != OP_COMMIT and request.op != OP_CLAIM:
            raise FrameError(ST_BAD_FRAME, "not a commit")
        if request.grant is None or not request.grant.op & GRANT_FLAG_COMMIT:
            raise FrameError(ST_BAD_GRANT, "the grant does not carry the COMMIT (shm) right")
        want = self._file_ids.get(request.segment_id)
        if want is not None and want != (file_dev, file_ino):
            raise FrameError(ST_UNKNOWN_SEGMENT, f"segment {request.segment_id}: the bytes went "
                             "into a replaced segment file (node restarted); remap and retry")
        # The same request as a WRITE (built directly: dataclasses.replace costs ~3 us)
        as_write = RequestHeader(OP_WRITE, request.request_id, request.segment_id,
                                 request.offset, request.length, request.meta_len,
                                 request.flags, request.grant)
        if request.op == OP_CLAIM:  # before the copy: the range's older entries go
            self._admit_write(as_write, meta, claim=True)
            return b""
        self._admit_write(as_write, meta)  # held, the copy done: released below
        try:
            return self.written(as_write, meta)
        finally:
            self.release(as_write)

    def flush(self) -> None:
        """Make every write completed so far durable in the index journal; the data server
        calls it before its replies leave (the index defers journal appends until then)."""
        self.index.flush_journal()

    def readable(self, request: RequestHeader) -> memoryview:
        segment, grant = self._check(request, OP_READ)
        try:
            tenant, key = self.index.admit_read(
                alloc_id=grant.alloc_id, segment_id=segment.segment_id, object_offset=grant.offset,
                length=grant.length, grant_expiry_ms=grant.expiry_ms, hold=True)
        except ReadRefused as exc:
            raise FrameError(ST_EXPIRED if exc.reason == ReadRefused.STALE else ST_BAD_GRANT,
                             str(exc)) from None
        if key_tag(tenant, key) != grant.key_tag:
            self.index.release(grant.alloc_id)  # refused: nothing is sent
            raise FrameError(ST_BAD_GRANT, f"allocation {grant.alloc_id} holds another object "
                             "than the grant names")
        offset = request.offset  # inside the segment: _check made sure
        return segment.memory[offset:offset + request.length]

    def rdma_connect(self, request: RequestHeader, qp_info: bytes) -> bytes:
        """RDMA_CONNECT: a queue pair for a peer that shows the grant of a data op on this node
        (authentic, of the current epoch, unexpired, inside a segment: `_check`); the node's
        queue-pair description. A stranger gets no queue pair (docs/security.md)."""
        accept = self.rdma_acceptor
        if accept is None:
            raise FrameError(ST_UNSUPPORTED, "this node serves no rdma")
        grant = request.grant
        if request.op != OP_RDMA_CONNECT or grant is None:
            raise FrameError(ST_BAD_GRANT, "an RDMA_CONNECT must carry a grant for this node")
        # Checked as the data request its grant is for (built directly, as `commit` does)
        data_op = grant.op & ~GRANT_FLAG_COMMIT
        self._check(RequestHeader(data_op, request.request_id, request.segment_id,
                                  request.offset, request.length, request.meta_len,
                                  request.flags, grant), data_op)
        return accept(qp_info)

    def _check(self, request: RequestHeader, op: int) -> tuple[Segment, Grant]:
        grant = request.grant
        if grant is None or request.op != op:
            raise FrameError(ST_BAD_FRAME, "data request without a grant")
        segment = self.segments.get(request.segment_id)
        if segment is None:
            raise FrameError(ST_UNKNOWN_SEGMENT, f"segment {request.segment_id} is not on this node")
        try:
            self._verifier.verify(
                grant,
                op=op,
                segment_id=request.segment_id,
                offset=request.offset,
                length=request.length,
                now_ms=self.clock.now_ms(),
                min_epoch=self.clock.epoch,
                allowed_skew_ms=self._allowed_skew_ms,
            )
        except GrantRejected as exc:
            raise FrameError(GRANT_STATUS.get(exc.reason, ST_BAD_GRANT), str(exc)) from None
        if not segment.contains(request.offset, request.length):
            raise FrameError(
                ST_OUT_OF_RANGE,
                f"[{request.offset}, +{request.length}) is outside segment {segment.segment_id} "
                f"({segment.size_bytes} bytes)",
            )
        return segment, grant
