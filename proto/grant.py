"""Grants: capabilities the master signs and storage nodes check on every data-plane request.

A grant says "this holder may do OP on [offset, offset+length) of segment S, which belongs to
allocation A of object K, under master epoch E, until EXPIRY". The MAC is keyed BLAKE2b
(16 bytes) over a fixed little-endian layout of exactly those fields, with the cluster secret
that the master and every node share. Knowing a node's address is therefore not enough to read
or write its memory, and a grant cannot be stretched to a neighbouring range.

This module lives in proto/ because it is part of the contract between the master (signs)
and storage nodes (verify); it holds no state and touches no payload.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

import xxhash

from cellar.proto._fastinit import fast_frozen_init

GRANT_OP_READ = 1
GRANT_OP_WRITE = 2
# A write grant whose op carries this bit also lets its holder COMMIT (say "the bytes already
# landed in your memory" after an shm memcpy or an rdma WRITE). The master sets it only for
# identities with the shm right; a node refuses a COMMIT under a grant without it, on every
# transport (issue 19: a COMMIT without data made a range "written" that held another
# tenant's freed bytes). A plain WRITE accepts either form of write grant.
GRANT_FLAG_COMMIT = 0x80
GRANT_OP_WRITE_COMMIT = GRANT_OP_WRITE | GRANT_FLAG_COMMIT
GRANT_MAC_BYTES = 16
MIN_SECRET_BYTES = 16

# The bytes a grant MAC covers: op, segment_id, offset, length, alloc_id, epoch, expiry_ms,
# key_tag. The one copy of the layout: the master's signer (cellar.master.grant_issuer) packs with it.
SIGNED_FIELDS = struct.Struct("<BQQQQQQQ")


# The key a put-ahead write grant names (docs/sdk.md "Putting ahead"): no key can be "\0"
# (a key with a NUL is refused), so `key_tag(tenant, ANY_KEY)` is no object's tag. A node
# lets a WRITE under a grant with that tag store one object of ANY key of that tenant (the
# first write of the allocation names it, and the node's receipt binds it: proto/receipt.py);
# the master binds the same key at PutEnd only if the receipt names it.
ANY_KEY = "\0"


def key_tag(tenant: str, key: str) -> int:
    """A 64-bit tag binding a grant to one object (tenant and key)."""
    return xxhash.xxh64_intdigest(key_tag_prefix(tenant) + key.encode())


def any_key_tag(tenant: str) -> int:
    """The tag of a put-ahead write grant of `tenant` (ANY_KEY)."""
    return key_tag(tenant, ANY_KEY)


def key_tag_prefix(tenant: str) -> bytes:
    """What `key_tag` hashes before the key's UTF-8 bytes; a caller tagging many keys of one
    tenant computes it once and hashes `prefix + key.encode()` with xxh64 itself."""
    return tenant.encode() + b"\0"


@fast_frozen_init  # built per data-plane frame and per replica: see cellar.proto._fastinit
@dataclass(frozen=True, slots=True)
class Grant:
    op: int
    segment_id: int
    offset: int
    length: int
    alloc_id: int
    epoch: int
    expiry_ms: int
    key_tag: int
    mac: bytes

    def covers(self, segment_id: int, offset: int, length: int) -> bool:
        """True if [offset, offset+length) of segment_id lies inside the granted range."""
        return (
            segment_id == self.segment_id
            and offset >= self.offset
            and length >= 0
            and offset + length <= self.offset + self.length
        )


def compute_mac(
    secret: bytes,
    op: int,
    segment_id: int,
    offset: int,
    length: int,
    alloc_id: int,
    epoch: int,
    expiry_ms: int,
    tag: int,
) -> bytes:
    message = SIGNED_FIELDS.pack(op, segment_id, offset, length, alloc_id, epoch, expiry_ms, tag)
    return hashlib.blake2b(message, key=secret, digest_size=GRANT_MAC_BYTES).digest()


def sign(
    secret: bytes,
    *,
    op: int,
    segment_id: int,
    offset: int,
    length: int,
    alloc_id: int,
    epoch: int,
    expiry_ms: int,
    tag: int,
) -> Grant:
    mac = compute_mac(secret, op, segment_id, offset, length, alloc_id, epoch, expiry_ms, tag)
    return Grant(op, segment_id, offset, length, alloc_id, epoch, expiry_ms, tag, mac)


class GrantRejected(Exception):
    """Why a grant was refused; `reason` is one of the class constants."""

    BAD_MAC = "bad_mac"
    EXPIRED = "expired"
    WRONG_OP = "wrong_op"
    OUT_OF_RANGE = "out_of_range"
    STALE_EPOCH = "stale_epoch"

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def verify(
    secret: bytes,
    grant: Grant,
    *,
    op: int,
    segment_id: int,
    offset: int,
    length: int,
    now_ms: int,
    min_epoch: int = 0,
    allowed_skew_ms: int = 0,
) -> None:
    """Raise GrantRejected unless `grant` is authentic, unexpired and covers the request.

    `now_ms` is the verifier's estimate of the master's clock; `allowed_skew_ms` absorbs the
    error of that estimate. `min_epoch` fences grants from an older master.
    """
    expected = compute_mac(
        secret,
        grant.op,
        grant.segment_id,
        grant.offset,
        grant.length,
        grant.alloc_id,
        grant.epoch,
        grant.expiry_ms,
        grant.key_tag,
    )
    _check(expected, grant, op, segment_id, offset, length, now_ms, min_epoch, allowed_skew_ms)


class GrantVerifier:
    """`verify` with the secret keyed once: each check copies the keyed BLAKE2b state instead
    of keying a new one (about half the cost; a storage node checks every frame). Same checks,
    same exceptions. Safe to share between threads (copy() only reads the keyed state)."""

    __slots__ = ("_keyed",)

    def __init__(self, secret: bytes) -> None:
        self._keyed = hashlib.blake2b(key=secret, digest_size=GRANT_MAC_BYTES)

    def verify(self, grant: Grant, *, op: int, segment_id: int, offset: int, length: int,
               now_ms: int, min_epoch: int = 0, allowed_skew_ms: int = 0) -> None:
        h = self._keyed.copy()
        h.update(SIGNED_FIELDS.pack(grant.op, grant.segment_id, grant.offset, grant.length,
                              grant.alloc_id, grant.epoch, grant.expiry_ms, grant.key_tag))
        _check(h.digest(), grant, op, segment_id, offset, length, now_ms, min_epoch,
               allowed_skew_ms)


def _check(expected_mac: bytes, grant: Grant, op: int, segment_id: int, offset: int,
           length: int, now_ms: int, min_epoch: int, allowed_skew_ms: int) -> None:
    """The checks of `verify` once the expected MAC is known."""
    if not hmac.compare_digest(expected_mac, grant.mac):
        raise GrantRejected(GrantRejected.BAD_MAC)
    if grant.op != op and grant.op != op | GRANT_FLAG_COMMIT:  # see GRANT_FLAG_COMMIT
        raise GrantRejected(GrantRejected.WRONG_OP, f"grant op {grant.op}, request op {op}")
    if grant.epoch < min_epoch:
        raise GrantRejected(GrantRejected.STALE_EPOCH, f"{grant.epoch} < {min_epoch}")
    if now_ms > grant.expiry_ms + allowed_skew_ms:
        raise GrantRejected(GrantRejected.EXPIRED, f"{now_ms - grant.expiry_ms} ms ago")
    if not grant.covers(segment_id, offset, length):
        raise GrantRejected(
            GrantRejected.OUT_OF_RANGE,
            f"[{offset}, +{length}) of segment {segment_id} not inside "
            f"[{grant.offset}, +{grant.length}) of segment {grant.segment_id}",
        )


# ---- node credentials ---------------------------------------------------------------------
# A storage node proves it is node N by sending `cellarnode_<mac>_<N>` as its request token,
# where mac is keyed BLAKE2b-128 (hex) of N under the cluster secret. Whoever holds the secret
# can already sign any grant, so deriving the credential from it gives nodes nothing new to
# provision, and clients (which never hold the secret) cannot make one.

NODE_CREDENTIAL_PREFIX = "cellarnode_"
_NODE_DOMAIN = b"cellar node credential\0"


def _node_mac(secret: bytes, node_id: str) -> str:
    return hashlib.blake2b(_NODE_DOMAIN + node_id.encode(), key=secret,
                           digest_size=GRANT_MAC_BYTES).hexdigest()


def node_credential(secret: bytes, node_id: str) -> str:
    """The bearer token node `node_id` sends on every master RPC."""
    return f"{NODE_CREDENTIAL_PREFIX}{_node_mac(secret, node_id)}_{node_id}"


def verify_node_credential(secret: bytes, token: str) -> str | None:
    """The node id a node credential proves, or None if it is not a valid one."""
    if not token.startswith(NODE_CREDENTIAL_PREFIX) or not token.isascii():
        return None  # compare_digest raises TypeError on non-ASCII str: never let it
    mac, sep, node_id = token[len(NODE_CREDENTIAL_PREFIX):].partition("_")
    if not sep or not node_id or len(mac) != 2 * GRANT_MAC_BYTES:
        return None
    return node_id if hmac.compare_digest(mac, _node_mac(secret, node_id)) else None
