"""The data-plane frame: one fixed little-endian header, optional metadata, then the payload.

Every transport that speaks over a byte stream (tcp today) uses exactly this layout, and
storage nodes check every field of it before touching memory:

request  = REQUEST header (108 bytes) + meta (meta_len bytes) + payload (length bytes, WRITE only)
response = RESPONSE header (28 bytes) + message (msg_len bytes, errors only)
           + payload (length bytes, READ with status OK only)

The request header carries the grant the master signed (segment, granted range, allocation,
epoch, expiry, key tag, MAC) and the range this request touches (offset, length), which must
lie inside the granted range. Decoding never allocates from a length that has not been
checked against the limits below; bad magic, version or op is a `FrameError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cellar.proto._fastinit import fast_frozen_init
from cellar.proto.grant import (
    GRANT_FLAG_COMMIT,
    GRANT_MAC_BYTES,
    GRANT_OP_READ,
    GRANT_OP_WRITE,
    Grant,
)

REQUEST_MAGIC = b"CLRQ"
RESPONSE_MAGIC = b"CLRP"
VERSION = 1

# Data ops share their numbers with the grant ops, so a grant's op is the request's op.
OP_READ = GRANT_OP_READ    # 1
OP_WRITE = GRANT_OP_WRITE  # 2
OP_PING = 3  # no grant, no payload: liveness and latency probe
# --- shm / rdma control ops (issue "Data plane at the machine's ceilings") ---
# COMMIT: "the bytes of [offset, +length) already landed in your segment memory" (shm memcpy or
# rdma one-sided WRITE). Carries a WRITE grant and COMMIT meta (WriteMeta + the identity of the
# segment file the client copied into), never a payload; `length` is the committed range, so it
# is bounded by the grant and the segment, not by the frame payload limit. The node runs the
# WRITE checks, then records the range as written.
OP_COMMIT = 4
# RDMA_CONNECT: meta = the client's queue-pair description; an OK reply carries the node's
# queue-pair description as `length` payload bytes (at most MAX_META_BYTES). It carries the
# grant of a data op the client is about to run on this node (a READ grant when the request
# flags say REQ_FLAG_READ_GRANT, else a WRITE grant), with `offset`/`length` its range: a queue
# pair is opened only for a peer the master granted something on this node (docs/security.md).
OP_RDMA_CONNECT = 5
# CLAIM: "I am about to copy into [offset, +length) of this allocation myself" (shm, rdma),
# sent and answered before the copy. Same grant and meta as COMMIT (the checksum is not known
# yet and is not looked at). The node runs the WRITE checks and drops the older entries the
# range overlaps, as a tcp write's first frame does, so no read under a grant of the range's
# previous allocation (freed by the master, its notice not here yet) is served from bytes that
# the copy is about to overwrite (docs/security.md). It records nothing else.
OP_CLAIM = 6
OPS = frozenset({OP_WRITE, OP_READ, OP_PING, OP_COMMIT, OP_RDMA_CONNECT, OP_CLAIM})
# Ops whose frame carries a WRITE grant and COMMIT meta but no payload
OPS_COMMIT_LIKE = frozenset({OP_COMMIT, OP_CLAIM})
OPS_WITHOUT_GRANT = frozenset({OP_PING})

# Response statuses (frame level; the SDK maps them to its exceptions).
ST_OK = 0
ST_BAD_FRAME = 1         # malformed header: the connection is closed after the reply
ST_BAD_GRANT = 2         # MAC, op or key tag does not match
ST_EXPIRED = 3           # grant expired
ST_OUT_OF_RANGE = 4      # range outside the grant or the segment
ST_UNKNOWN_SEGMENT = 5
ST_SEALED = 6            # write into an allocation that was already completely written
ST_TOO_LARGE = 7         # length or meta over the limit
ST_INTERNAL = 8
ST_UNSUPPORTED = 9
ST_STALE_EPOCH = 10      # grant from an older master
# Transfers are still in flight on this allocation (a seal waits for them) or on an older
# allocation in its range (a newer one is admitted once they end, by their grants' expiry at
# the latest): nothing was recorded; the SDK retries the put on a new allocation
ST_BUSY = 11
STATUS_NAMES = {
    ST_OK: "ok", ST_BAD_FRAME: "bad frame", ST_BAD_GRANT: "bad grant", ST_EXPIRED: "grant expired",
    ST_OUT_OF_RANGE: "out of range", ST_UNKNOWN_SEGMENT: "unknown segment",
    ST_SEALED: "allocation sealed", ST_TOO_LARGE: "too large", ST_INTERNAL: "internal error",
    ST_UNSUPPORTED: "unsupported", ST_STALE_EPOCH: "stale epoch", ST_BUSY: "range busy",
}

# Limits (bytes). A node may configure a lower max frame payload; never a higher meta limit.
MAX_META_BYTES = 4096
MAX_MESSAGE_BYTES = 1024
DEFAULT_MAX_FRAME_PAYLOAD_BYTES = 64 << 20

# magic, version, op, flags, meta_len, request_id, segment_id, grant_offset, grant_length,
# alloc_id, epoch, expiry_ms, key_tag, mac, offset, length
REQUEST = struct.Struct(f"<4sBBHIQQQQQQQQ{GRANT_MAC_BYTES}sQQ")
# magic, version, status, flags, msg_len, request_id, length
RESPONSE = struct.Struct("<4sBBHIQQ")
# Response flags. CLOSE: the server closes the connection after this response (it could not
# keep the stream in sync, e.g. a malformed header), so requests pipelined behind it are lost.
RESP_FLAG_CLOSE = 0x1
# Request flags. MAY_COMMIT: the grant's op carries GRANT_FLAG_COMMIT (the frame carries no
# grant op of its own: the request's op stands for it), so the MAC covers the right.
REQ_FLAG_MAY_COMMIT = 0x1
# READ_GRANT: an RDMA_CONNECT carries a READ grant (its op field stands for no data op).
REQ_FLAG_READ_GRANT = 0x2
# Byte offset of request_id in a REQUEST header, so an error reply to a header that failed to
# decode can still name the request it answers.
REQUEST_ID_OFFSET = 12
# object checksum (xxh3_64 of the whole value), object size, tenant bytes, key bytes
WRITE_META = struct.Struct("<QQHH")


class FrameError(Exception):
    """A request or response that must be refused with `status`."""

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(message or STATUS_NAMES.get(status, str(status)))
        self.status = status
        self.message = message or STATUS_NAMES.get(status, str(status))


def grant_flags(grant: Grant) -> int:
    """The request flags that carry what of `grant` the header has no field for."""
    return REQ_FLAG_MAY_COMMIT if grant.op & GRANT_FLAG_COMMIT else 0


def request_flags(op: int, grant: Grant) -> int:
    """`grant_flags`, plus, for an RDMA_CONNECT, whether its grant is a READ grant."""
    flags = grant_flags(grant)
    if op == OP_RDMA_CONNECT and (grant.op & ~GRANT_FLAG_COMMIT) == GRANT_OP_READ:
        flags |= REQ_FLAG_READ_GRANT
    return flags


@dataclass(slots=True)
class RequestHeader:
    op: int
    request_id: int
    segment_id: int
    offset: int
    length: int
    meta_len: int = 0
    flags: int = 0
    grant: Grant | None = None

    def pack(self) -> bytes:
        g = self.grant
        if g is None:
            return REQUEST.pack(REQUEST_MAGIC, VERSION, self.op, self.flags, self.meta_len,
                                self.request_id, self.segment_id, 0, 0, 0, 0, 0, 0,
                                bytes(GRANT_MAC_BYTES), self.offset, self.length)
        return REQUEST.pack(REQUEST_MAGIC, VERSION, self.op, self.flags | request_flags(self.op, g),
                            self.meta_len, self.request_id, g.segment_id, g.offset, g.length, g.alloc_id,
                            g.epoch, g.expiry_ms, g.key_tag, g.mac, self.offset, self.length)


def decode_request(header: bytes | memoryview, *, max_payload_bytes: int) -> RequestHeader:
    """Parse and bound-check a request header; raises FrameError."""
    if len(header) != REQUEST.size:
        raise FrameError(ST_BAD_FRAME, "short header")
    (magic, version, op, flags, meta_len, request_id, segment_id, grant_offset, grant_length,
     alloc_id, epoch, expiry_ms, tag, mac, offset, length) = REQUEST.unpack(header)
    if magic != REQUEST_MAGIC:
        raise FrameError(ST_BAD_FRAME, "bad magic")
    if version != VERSION:
        raise FrameError(ST_UNSUPPORTED, f"frame version {version}")
    if op not in OPS:
        raise FrameError(ST_BAD_FRAME, f"unknown op {op}")
    if meta_len > MAX_META_BYTES:
        raise FrameError(ST_TOO_LARGE, f"meta {meta_len} > {MAX_META_BYTES} bytes")
    if length > max_payload_bytes and op not in OPS_COMMIT_LIKE:  # no payload follows
        raise FrameError(ST_TOO_LARGE, f"length {length} > {max_payload_bytes} bytes")
    grant = None
    if op not in OPS_WITHOUT_GRANT:
        # a commit finishes a granted write, a claim starts one; a connect names its grant's op
        if op == OP_RDMA_CONNECT:
            grant_op = OP_READ if flags & REQ_FLAG_READ_GRANT else OP_WRITE
        else:
            grant_op = OP_WRITE if op in OPS_COMMIT_LIKE else op
        if flags & REQ_FLAG_MAY_COMMIT:
            grant_op |= GRANT_FLAG_COMMIT
        grant = Grant(grant_op, segment_id, grant_offset, grant_length, alloc_id, epoch,
                      expiry_ms, tag, mac)
    return RequestHeader(op, request_id, segment_id, offset, length, meta_len, flags, grant)


def pack_response(status: int, request_id: int, length: int = 0, message: str = "",
                  flags: int = 0) -> bytes:
    """Header plus the (bounded) error message; the READ payload is sent separately."""
    msg = message.encode("utf-8", "replace")[:MAX_MESSAGE_BYTES] if status != ST_OK else b""
    return RESPONSE.pack(RESPONSE_MAGIC, VERSION, status, flags, len(msg), request_id,
                         length) + msg


@dataclass(slots=True)
class ResponseHeader:
    status: int
    request_id: int
    length: int
    msg_len: int
    flags: int = 0


def decode_response(header: bytes | memoryview, *, max_payload_bytes: int) -> ResponseHeader:
    if len(header) != RESPONSE.size:
        raise FrameError(ST_BAD_FRAME, "short response header")
    magic, version, status, flags, msg_len, request_id, length = RESPONSE.unpack(header)
    if magic != RESPONSE_MAGIC or version != VERSION:
        raise FrameError(ST_BAD_FRAME, "bad response magic/version")
    if msg_len > MAX_MESSAGE_BYTES or length > max_payload_bytes:
        raise FrameError(ST_TOO_LARGE, "response over the limits")
    return ResponseHeader(status, request_id, length, msg_len, flags)


@fast_frozen_init  # decoded per write frame (cellar.proto._fastinit)
@dataclass(slots=True, frozen=True)
class WriteMeta:
    """What a storage node records in its own index for a written allocation."""

    checksum: int
    object_size: int
    tenant: str
    key: str

    def pack(self) -> bytes:
        tenant, key = self.tenant.encode(), self.key.encode()
        if WRITE_META.size + len(tenant) + len(key) > MAX_META_BYTES:
            raise FrameError(ST_TOO_LARGE, f"write meta over {MAX_META_BYTES} bytes")
        return WRITE_META.pack(self.checksum, self.object_size, len(tenant), len(key)) + tenant + key


def decode_write_meta(meta: bytes | memoryview) -> WriteMeta:
    if len(meta) < WRITE_META.size:
        raise FrameError(ST_BAD_FRAME, "short write meta")
    checksum, object_size, tenant_len, key_len = WRITE_META.unpack_from(meta)
    if WRITE_META.size + tenant_len + key_len != len(meta):
        raise FrameError(ST_BAD_FRAME, "write meta lengths disagree")
    body = bytes(meta[WRITE_META.size:])
    try:
        tenant = body[:tenant_len].decode()
        key = body[tenant_len:].decode()
    except UnicodeDecodeError:
        raise FrameError(ST_BAD_FRAME, "write meta is not UTF-8") from None
    return WriteMeta(checksum, object_size, tenant, key)


# COMMIT meta = WriteMeta bytes + this trailer: (st_dev, st_ino) of the segment file the client
# mapped and copied into, so a node whose file was replaced (it restarted) refuses the commit
# instead of recording bytes that landed in the old, orphaned memory.
COMMIT_TRAILER = struct.Struct("<QQ")


def pack_commit_meta(meta: WriteMeta, file_dev: int, file_ino: int) -> bytes:
    return meta.pack() + COMMIT_TRAILER.pack(file_dev, file_ino)


_CHECKSUM_FIELD = struct.Struct("<Q")  # WRITE_META's first field, so also a COMMIT meta's


def with_checksum(packed_meta: bytes, checksum: int) -> bytes:
    """A packed write or COMMIT meta with its checksum field set to `checksum` (a shm write
    hashed as it was copied names its digest only then): the bytes `pack` would give with that
    checksum, without decoding and packing the rest again (~4 us per COMMIT, measured in a
    batch of 128 x 64 KiB shm puts)."""
    if len(packed_meta) < WRITE_META.size:
        raise FrameError(ST_BAD_FRAME, "short write meta")
    return _CHECKSUM_FIELD.pack(checksum) + packed_meta[_CHECKSUM_FIELD.size:]


def decode_commit_meta(meta: bytes | memoryview) -> tuple[WriteMeta, int, int]:
    """(write meta, file dev, file ino); FrameError if malformed."""
    if len(meta) < COMMIT_TRAILER.size:
        raise FrameError(ST_BAD_FRAME, "short commit meta")
    cut = len(meta) - COMMIT_TRAILER.size
    dev, ino = COMMIT_TRAILER.unpack_from(meta, cut)
    return decode_write_meta(meta[:cut]), dev, ino
