"""Receipt checks at PutEnd: the master believes what the nodes saw, not what a client says.

What it owns
    The rule that makes a put COMPLETE (issue 19): every replica the master counts must come
    with a write receipt (cellar.proto.receipt) that names exactly the allocation the master
    granted for it: alloc id, segment, offset, the object's size, this master's epoch, and the
    checksum the PutEnd declares, under a MAC with the cluster secret. Only a node signs
    receipts, and only when it sealed the allocation (every byte arrived by WRITE, or by a
    COMMIT under a grant with the shm right), so a PutEnd that skipped the writes, wrote
    part of the bytes, or names another put's allocation is refused and its put revoked.

Why it matters
    A COMPLETE version's ranges are freed at once when it goes (objects.py: the node sealed
    them, so no grant can write there again). That was only true if the node had in fact seen
    the allocation; a client could declare a put complete without a byte written, remove it,
    and keep a live write grant into a range the master handed to another tenant (the ghost
    write), or fill the cluster with objects no node holds. A revoked put's ranges go to
    quarantine until its grants expire (objects.release_ranges), so nothing is freed early.

Cost: one keyed BLAKE2b per replica (the copy of a pre-keyed state, as for grants), measured
in bench/results/receipts-2026-12-03-vm.md. It holds the cluster secret and never logs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cellar.proto.receipt import (
    MAX_RECEIPTS_PER_ITEM,
    Receipt,
    ReceiptRejected,
    ReceiptSigner,
    peek_alloc_id,
)

if TYPE_CHECKING:
    from cellar.master.state.records import Obj


class ReceiptChecker:
    """Checks a PutEnd item's receipts against the put's granted replicas."""

    def __init__(self, secret: bytes, epoch: int) -> None:
        self._signer = ReceiptSigner(secret)
        self.epoch = epoch
        self.refused = 0  # PutEnd items refused for want of a valid receipt

    def why_not(self, obj: Obj, checksum: int, receipts: Sequence[bytes]) -> str:
        """"" if `receipts` prove every replica of `obj` sealed for its key (`obj.tag`) with
        `checksum`, else why not."""
        if len(receipts) > MAX_RECEIPTS_PER_ITEM:
            return self._refuse(f"more than {MAX_RECEIPTS_PER_ITEM} receipts")
        if len(receipts) == 1 and len(obj.replicas) == 1:  # the common put: no dict
            by_alloc = {obj.replicas[0].alloc_id: receipts[0]}
        else:
            by_alloc = {peek_alloc_id(raw): raw for raw in receipts}
        signer = self._signer
        for rep in obj.replicas:
            raw = by_alloc.get(rep.alloc_id)
            if raw is None:
                return self._refuse(f"no node receipt for allocation {rep.alloc_id} "
                                    f"(segment {rep.segment.segment_id}): its bytes were not all "
                                    "written")
            fields = (rep.alloc_id, rep.segment.segment_id, rep.offset, obj.size, self.epoch,
                      obj.tag, checksum)
            if signer.is_exactly(raw, *fields):
                continue
            try:  # refused: `check` says why
                signer.check(raw, Receipt(*fields))
            except ReceiptRejected as exc:
                return self._refuse(f"allocation {rep.alloc_id}: {exc}")
            return self._refuse(f"allocation {rep.alloc_id}: the receipt is not the granted one")
        return ""

    def proves(self, raw: bytes, alloc_id: int, segment_id: int, offset: int, length: int,
               checksum: int) -> bool:
        """Whether `raw` is a node's receipt of exactly this sealed range (a node's own copy,
        master/repair.py; its key is the one the copy order's grant named)."""
        try:
            got = self._signer.open(raw)
        except ReceiptRejected:
            got = None
        if got is None or (got.alloc_id, got.segment_id, got.offset, got.length, got.epoch,
                           got.checksum) != (alloc_id, segment_id, offset, length, self.epoch,
                                             checksum):
            self.refused += 1
            return False
        return True

    def wrote(self, obj: Obj, checksum: int, receipts: Sequence[bytes]) -> bool:
        """Whether these receipts prove that their holder wrote the COMPLETE `obj` itself: one
        authentic receipt (of any epoch: a new master adopted `obj` from the nodes) names one of
        its replicas exactly, with its checksum. Only the writer of an allocation gets its
        receipt, so a PutEnd repeated after a master restart or failover, whose first reply was
        lost, is answered OK rather than NOT_FOUND (and its put is not started over)."""
        if checksum != obj.checksum:
            return False
        tag = obj.tag
        for raw in receipts[:MAX_RECEIPTS_PER_ITEM]:
            try:
                got = self._signer.open(raw)
            except ReceiptRejected:
                continue
            for rep in obj.replicas:
                if (got.alloc_id, got.segment_id, got.offset, got.length, got.key_tag,
                        got.checksum) == (rep.alloc_id, rep.segment.segment_id, rep.offset,
                                          obj.size, tag, checksum):
                    return True
        return False

    def _refuse(self, why: str) -> str:
        self.refused += 1
        return why
