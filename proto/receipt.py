"""Write receipts: a storage node's signed word that every byte of an allocation arrived.

A receipt says "node storage of segment S received every byte of allocation A, the range
[offset, offset + length), under master epoch E, for the object whose key tag is T
(proto/grant.py `key_tag` of its tenant and key), and the writer declared checksum C". The node
issues it once, when it seals the allocation (storage_node/access.py: the WRITE or the COMMIT
that completed it); the client hands it, one per replica, to the master in PutEnd; the master
makes the object COMPLETE only when every replica it counts has a receipt that names exactly
the allocation it granted, for the key the PutEnd names, with the checksum the PutEnd declares
(master/receipts.py). The key tag matters for a put-ahead allocation, whose grant names no key:
the key the node stored is the one the master binds. So the
master believes what a node saw, never what a client says (issue 19: a PutEnd without a
byte written no longer makes an object).

Layout (the one copy, beside the grant's `SIGNED_FIELDS` in proto/grant.py): the fixed
little-endian `RECEIPT_FIELDS` (a domain tag, alloc_id, segment_id, offset, length, epoch,
key tag, checksum), then the keyed BLAKE2b MAC (GRANT_MAC_BYTES) over those bytes with the cluster
secret, the same primitive and key as a grant. The domain tag keeps a receipt from ever
verifying as anything else signed with that key (a grant's message is another length and has
no tag). `RECEIPT_BYTES` in all; it rides as the payload of a WRITE's or COMMIT's OK reply.

What a receipt does not prove: that the bytes are the ones the client meant (the checksum is
the writer's declaration, checked by every reader), or that the node still holds them.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from cellar.proto.grant import GRANT_MAC_BYTES

RECEIPT_TAG = b"CLRC"
# tag, alloc_id, segment_id, offset, length, epoch, key_tag, checksum
RECEIPT_FIELDS = struct.Struct("<4sQQQQQQQ")
RECEIPT_BYTES = RECEIPT_FIELDS.size + GRANT_MAC_BYTES  # 76
MAX_RECEIPTS_PER_ITEM = 16  # a PutEnd item carries at most this many (one per replica)


@dataclass(frozen=True, slots=True)
class Receipt:
    alloc_id: int
    segment_id: int
    offset: int
    length: int
    epoch: int
    key_tag: int
    checksum: int


class ReceiptRejected(Exception):
    """A receipt that does not prove what it must (`reason` says which check failed)."""


class ReceiptSigner:
    """Signs and checks receipts with the secret keyed once (each call copies the keyed
    BLAKE2b state, as `GrantVerifier` does). Safe to share between threads."""

    __slots__ = ("_keyed",)

    def __init__(self, secret: bytes) -> None:
        self._keyed = hashlib.blake2b(key=secret, digest_size=GRANT_MAC_BYTES)

    def _mac(self, fields: bytes) -> bytes:
        h = self._keyed.copy()
        h.update(fields)
        return h.digest()

    def sign(self, *, alloc_id: int, segment_id: int, offset: int, length: int, epoch: int,
             key_tag: int, checksum: int) -> bytes:
        """The receipt's bytes (RECEIPT_BYTES)."""
        assert alloc_id > 0 and offset >= 0 and length >= 0, (alloc_id, offset, length)
        fields = RECEIPT_FIELDS.pack(RECEIPT_TAG, alloc_id, segment_id, offset, length, epoch,
                                     key_tag, checksum)
        return fields + self._mac(fields)

    def is_exactly(self, raw: bytes, alloc_id: int, segment_id: int, offset: int, length: int,
                   epoch: int, key_tag: int, checksum: int) -> bool:
        """Whether `raw` is an authentic receipt for exactly these fields: `check`'s test
        without its Receipt objects (0.5 against 2.8 us, once per replica of every PutEnd).
        Comparing the receipt's field bytes with the expected fields packed is the same test
        as unpacking and comparing them: one fixed layout has one encoding of each value."""
        fields = RECEIPT_FIELDS.pack(RECEIPT_TAG, alloc_id, segment_id, offset, length, epoch,
                                     key_tag, checksum)
        size = RECEIPT_FIELDS.size
        if len(raw) != RECEIPT_BYTES or raw[:size] != fields:
            return False
        return hmac.compare_digest(self._mac(fields), raw[size:])

    def check(self, raw: bytes, expected: Receipt) -> None:
        """Raise ReceiptRejected unless `raw` is an authentic receipt for exactly `expected`."""
        got = self.open(raw)
        if got != expected:
            raise ReceiptRejected(f"the receipt names {got}, not the granted {expected}")


    def open(self, raw: bytes) -> Receipt:
        """The fields of an authentic receipt, whatever it names (raise ReceiptRejected if it
        is not one): for a master that must recognise a receipt another epoch granted."""
        if len(raw) != RECEIPT_BYTES:
            raise ReceiptRejected(f"a receipt is {RECEIPT_BYTES} bytes, not {len(raw)}")
        fields = raw[:RECEIPT_FIELDS.size]
        if not hmac.compare_digest(self._mac(fields), raw[RECEIPT_FIELDS.size:]):
            raise ReceiptRejected("bad receipt MAC")
        tag, *values = RECEIPT_FIELDS.unpack(fields)
        if tag != RECEIPT_TAG:
            raise ReceiptRejected("not a receipt")
        return Receipt(*values)


def peek_alloc_id(raw: bytes) -> int:
    """The alloc id a receipt claims (unverified: for matching receipts to replicas)."""
    if len(raw) != RECEIPT_BYTES:
        return 0
    return int(RECEIPT_FIELDS.unpack_from(raw)[1])
