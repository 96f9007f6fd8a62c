"""Write receipts for tests that drive the master without a storage node.

A test that calls PutEnd on a bare master (no node saw the bytes) must sign the receipts a
node would have returned, with the cluster secret the test gave the master: the master
completes a put only with one valid receipt per replica (cellar.master.receipts).
"""

from __future__ import annotations

from typing import Any

from cellar.proto.receipt import ReceiptSigner


def receipts_for(secret: bytes, started: Any, checksum: int, key_tag: int | None = None) -> list[bytes]:
    """The receipts of every replica of one PutStart result (a service `PutStartResult` or a
    proto one), as the nodes would sign them once every byte arrived; `key_tag`: the key the
    node stored (default: the grant's, which a put-ahead grant does not name)."""
    signer = ReceiptSigner(secret)
    out = []
    for rep in started.replicas:
        grant = rep if hasattr(rep, "alloc_id") else rep.grant  # proto Replica: nested grant
        out.append(signer.sign(alloc_id=grant.alloc_id, segment_id=rep.segment_id,
                               offset=rep.offset, length=rep.length, epoch=grant.epoch,
                               key_tag=grant.key_tag if key_tag is None else key_tag,
                               checksum=checksum))
    return out
