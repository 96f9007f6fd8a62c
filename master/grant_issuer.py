"""Grant signing on the master's hot path.

Every replica in a PutStart or GetReplicas reply carries a grant MAC. `GrantSigner.mac` computes
exactly `cellar.proto.grant.compute_mac` (keyed BLAKE2b-128 over the contract's layout,
`cellar.proto.grant.SIGNED_FIELDS`, which is the one copy of it), but keys the hash once and
copies that state per grant instead of re-keying, and returns bare bytes instead of a frozen
`Grant` dataclass: about 3x cheaper per replica. A unit test checks that
`cellar.proto.grant.verify` accepts what it signs.

This module holds the cluster secret and must never log or return it.
"""

from __future__ import annotations

import hashlib

from cellar.proto.grant import GRANT_MAC_BYTES, MIN_SECRET_BYTES, SIGNED_FIELDS


class GrantSigner:
    __slots__ = ("_keyed", "_pack")

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"cluster secret must be at least {MIN_SECRET_BYTES} bytes")
        self._keyed = hashlib.blake2b(key=secret, digest_size=GRANT_MAC_BYTES)
        self._pack = SIGNED_FIELDS.pack

    def mac(
        self, op: int, segment_id: int, offset: int, length: int, alloc_id: int, epoch: int,
        expiry_ms: int, tag: int,
    ) -> bytes:
        # No check here: GrantIssuer (master/replies.py) asserts the fields once per reply and
        # range, and the pack raises struct.error on any field outside 64 bits.
        h = self._keyed.copy()
        h.update(self._pack(op, segment_id, offset, length, alloc_id, epoch, expiry_ms, tag))
        return h.digest()
