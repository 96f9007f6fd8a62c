"""How a batch of ops becomes frames on TCP lanes: shared by the threaded and the asyncio client.

Both `tcp.TcpTransport` (blocking sockets, one thread per lane) and
`tcp_async.AsyncTcpTransport` (the event loop's sockets, one task per lane) move a batch the same
way, decided here once:
1. `plan_batch` checks every op (a tcp endpoint, contiguous buffers, a writable destination, the
   WriteMeta of a write, the range inside the grant: an op cut into several frames must never
   land partly because of its own range) and cuts it into chunks of at most `chunk_bytes`, each
   one frame. A chunk is a tuple of views: one for a plain op, one per part it touches for a
   scatter-gather op (`TransferOp.parts`), so a chunk may start and end inside any part and the
   frame's payload still goes straight between the socket and the caller's memory (iovecs).
2. `lanes_for` chooses how many connections one node's share is striped over; `deal` hands the
   chunks out to them, least-loaded first, keeping input order within each lane.
3. `finish` turns the plan's failures and lane checksums into one `TransferResult` per op.
4. `add_request` appends one chunk's request frame to a send list (header, a write's meta and
   its payload views, one iovec each); `check_response` matches a reply's header to the request it must answer (both clients read
   replies in order on each connection); anything else is a `Desync` and ends the connection.

A one-frame read whose op asked for its checksum is hashed by its lane as its bytes land
(`Plan.hashed`/`Plan.sums`); so is a multi-frame one whose frames all went to one lane
(`Plan.spans`, as a read batch of one node on one lane does); others are hashed by the caller
afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from xxhash import xxh3_64

from cellar.proto.grant import Grant
from cellar.proto.receipt import RECEIPT_BYTES
from cellar.transfer.base import TransferOp, TransferResult, op_views, slice_views
from cellar.transfer.frame import (
    OP_READ,
    OP_WRITE,
    REQUEST,
    REQUEST_MAGIC,
    ST_BAD_FRAME,
    ST_OK,
    ST_OUT_OF_RANGE,
    ST_UNSUPPORTED,
    VERSION,
    FrameError,
    decode_response,
    grant_flags,
)
from cellar.transfer.tls_sock import TLS_SCHEME

# Striping policy, measured on 2-core loopback (see tcp.py's docstring): frames much smaller
# than chunk_bytes are bound by per-frame CPU, where extra lanes only add GIL and thread-hop
# costs, so a node's share of a batch is striped only when its frames average at least
# chunk_bytes / STRIPE_CHUNK_FRACTION, and over at most one lane per min_stripe_bytes.
STRIPE_CHUNK_FRACTION = 8

# A chunk on its way: (op index, absolute segment offset, the views its payload occupies
# (in order), their total bytes, grant).
Chunk = tuple[int, int, tuple[memoryview, ...], int, Grant]


def add_request(parts: list[bytes | memoryview], op_code: int, rid: int, chunk: Chunk,
                meta: bytes) -> None:
    """Append `chunk`'s request frame to `parts`: its header (with `meta`, a write's packed
    WriteMeta, b"" for a read), then for a write the payload views, one iovec per part.
    Measured (timeit, min of 21 runs of 100,000, three runs on the shared 2-core box): 0.63 to
    0.90 us per chunk against 0.40 to 0.72 us for the copy each client had inlined, so at most
    0.5 us of a TCP op's ~60 us (bench/results/2026-11-29-vm.md): one source wins."""
    _op_i, offset, views, size, g = chunk
    head = REQUEST.pack(REQUEST_MAGIC, VERSION, op_code, grant_flags(g), len(meta), rid,
                        g.segment_id,
                        g.offset, g.length, g.alloc_id, g.epoch, g.expiry_ms, g.key_tag, g.mac,
                        offset, size)
    parts.append(head + meta if meta else head)
    if op_code == OP_WRITE:
        parts.extend(views)  # scatter-gather: one iovec per part


class Desync(Exception):
    """A response that does not answer the request it should (id, length, status shape)."""


def check_response(head: bytes | memoryview, rid: int, size: int,
                   is_read: bool) -> tuple[int, int, int, int]:
    """(status, flags, message length, payload length) of the reply to request `rid` for a
    chunk of `size` bytes: `decode_response`'s checks (magic, version, limits), then the match
    (its id, an OK read carries exactly `size` bytes, an OK write none or a receipt of exactly
    RECEIPT_BYTES, an error none). Desync otherwise.
    Measured (timeit, Python 3.11, 2-core dev box, min of 21 runs of 100,000): 0.55 us per
    chunk against 0.26 us for the copy of these checks both clients had inlined, i.e. 0.3 us
    of a TCP op's ~60 us (bench/results/2026-11-29-vm.md, 64 KiB x128): one source wins."""
    try:
        header = decode_response(head, max_payload_bytes=size if is_read else RECEIPT_BYTES)
    except FrameError as exc:
        raise Desync(f"bad response header: {exc}") from None
    if header.request_id != rid:
        raise Desync(f"response to request {header.request_id}, expected {rid}")
    if header.status == ST_OK:
        if header.length != size if is_read else header.length not in (0, RECEIPT_BYTES):
            raise Desync(f"response length {header.length} for {size} bytes")
        if header.msg_len:
            raise Desync("an OK response with a message")
    elif header.length:
        raise Desync("error response with a payload")
    return header.status, header.flags, header.msg_len, header.length


@dataclass(slots=True)
class Plan:
    fail: list[TransferResult | None]      # per op: why it failed (None: so far so good)
    metas: list[bytes]                     # per op: packed WriteMeta (writes)
    hashed: list[bool]                     # per op: the lane hashes it (one-frame reads)
    sums: list[int | None]                 # per op: the lane's xxh3_64 of a hashed read
    receipts: list[bytes]                  # per op: the write receipt a reply carried
    # multi-frame reads that want their checksum: op -> (first, end) segment offset; a lane
    # that receives all of such an op's frames, in order, hashes it as it lands
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    # such an op being hashed: op -> (its digest so far, the offset its next frame must start at)
    runs: dict[int, tuple[xxh3_64, int]] = field(default_factory=dict)
    by_address: dict[str, list[Chunk]] = field(default_factory=dict)
    bytes_by_address: dict[str, int] = field(default_factory=dict)


def plan_batch(ops: Sequence[TransferOp], transport_name: str, op_code: int,
               chunk_bytes: int) -> Plan:
    """Check every op and cut it into chunks grouped by node address."""
    n_ops = len(ops)
    plan = Plan([None] * n_ops, [b""] * n_ops, [False] * n_ops, [None] * n_ops, [b""] * n_ops)
    fail, by_address, bytes_by_address = plan.fail, plan.by_address, plan.bytes_by_address
    is_read = op_code == OP_READ
    for i, op in enumerate(ops):
        address = op.route.endpoints.get(transport_name)
        if not address:
            fail[i] = TransferResult(ST_UNSUPPORTED, f"segment {op.route.segment_id} on "
                                     f"node {op.route.node_id} has no {transport_name} endpoint")
            continue
        try:
            views = op_views(op, writable=is_read)
            if op_code == OP_WRITE:
                if op.meta is None:
                    raise FrameError(ST_BAD_FRAME, "a write needs its WriteMeta")
                plan.metas[i] = op.meta.pack()
        except (ValueError, TypeError) as e:
            fail[i] = TransferResult(ST_UNSUPPORTED, f"buffer: {e}")
            continue
        except FrameError as e:
            fail[i] = TransferResult(e.status, e.message)
            continue
        n = sum(len(v) for v in views) if len(views) > 1 else len(views[0])
        grant = op.grant
        if not grant.covers(grant.segment_id, op.offset, n):
            fail[i] = TransferResult(ST_OUT_OF_RANGE, f"[{op.offset}, +{n}) is outside the "
                                     f"grant [{grant.offset}, +{grant.length})")
            continue
        chunks = by_address.setdefault(address, [])
        if n <= chunk_bytes:
            plan.hashed[i] = op.want_checksum and is_read
            chunks.append((i, op.offset, views, n, grant))
        elif len(views) == 1:
            view = views[0]
            if op.want_checksum and is_read:
                plan.spans[i] = (op.offset, op.offset + n)
            for pos in range(0, n, chunk_bytes):
                piece = view[pos:pos + chunk_bytes]
                chunks.append((i, op.offset + pos, (piece,), len(piece), grant))
        else:
            for pos in range(0, n, chunk_bytes):
                size = min(chunk_bytes, n - pos)
                chunks.append((i, op.offset + pos, slice_views(views, pos, size), size, grant))
        bytes_by_address[address] = bytes_by_address.get(address, 0) + n
    return plan


# A read batch of up to READ_FEW_LANES_MAX_BYTES from one node stripes over at most one lane
# per READ_LANE_CPUS of this process's CPUs (`read_connections_per_node` may say otherwise).
# Measured on the 2-core VMs (`cellar bench --only data --transports tcp`, three runs each way,
# alternated): get/ceiling with one lane against four, 4 MiB x 16 0.73-0.88 vs 0.50-0.68,
# 4 MiB x 128 0.71-0.86 vs 0.57-0.72, 1 MiB x 16/128 0.51-0.79 vs 0.43-0.64, 16 MiB x 16 the
# same (0.59-0.70): each lane's thread and its twin on the node contend for two cores and
# their caches. A larger share stripes as writes do: 16 MiB x 128 (2 GiB) into fresh memory
# ran 0.15-0.24 with one lane against 0.36-0.46 with four, the page faults of the
# destinations then being the bound, and they spread over lanes. Writes stripe in any case:
# 2-4 lanes put 16 x 4 MiB at 2.5-3.1 GB/s against 2.1-2.2 for one (the node's per-frame
# work overlaps another lane's bytes). The asyncio transport (one loop, a socket per lane) the
# same: 16 x 1/4/16 MiB get_many_into on one lane 3.70/4.10/3.67 GB/s against 2.84/3.49/3.23
# (and with its reads hashed as they land, 20 alternated batches: 16 MiB 4.50 against 3.92,
# 1 and 4 MiB the same, 3.9 and 3.7). Not over TLS, where each lane's decryption is CPU work
# that spreads over the cores: 16 x 1/4/16 MiB gets from a TLS node, 16 alternated batches
# in two runs, ran 0.73-1.05/0.78-1.29/0.81-0.85 GB/s on one lane against
# 0.94-1.13/1.01-1.18/0.98-1.10 on four; TLS endpoints stripe reads as writes.
READ_LANE_CPUS = 2
READ_FEW_LANES_MAX_BYTES = 512 << 20


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_lanes(connections_per_node: int, read_connections_per_node: int | None) -> int:
    """A transport's `read_connections_per_node` option checked, or its default (None)."""
    if read_connections_per_node is None:
        return max(1, min(connections_per_node, usable_cpus() // READ_LANE_CPUS))
    if not 1 <= read_connections_per_node <= connections_per_node:
        raise ValueError("read_connections_per_node must be in [1, connections_per_node]")
    return read_connections_per_node


def lanes_for(n_chunks: int, nbytes: int, *, chunk_bytes: int, connections_per_node: int,
              min_stripe_bytes: int, is_read: bool = False,
              read_connections_per_node: int | None = None, address: str = "") -> int:
    """How many connections to stripe one node's share of a batch over (`address`: the node's
    endpoint; a TLS one stripes reads as writes, READ_LANE_CPUS says why)."""
    if n_chunks <= 1 or nbytes * STRIPE_CHUNK_FRACTION < chunk_bytes * n_chunks:
        return 1
    most = connections_per_node
    if is_read and read_connections_per_node is not None and nbytes <= READ_FEW_LANES_MAX_BYTES \
            and not address.startswith(TLS_SCHEME):
        most = read_connections_per_node
    by_bytes = nbytes // min_stripe_bytes if min_stripe_bytes > 0 else n_chunks
    return max(1, min(most, n_chunks, by_bytes))


def deal(chunks: list[Chunk], lanes: int) -> list[list[Chunk]]:
    """Chunks to `lanes` lists, each chunk to the lane with the fewest bytes so far, so a large
    object spreads over every lane while input order holds within each lane."""
    if lanes == 1:
        return [chunks]
    out: list[list[Chunk]] = [[] for _ in range(lanes)]
    load = [0] * lanes
    for c in chunks:
        k = load.index(min(load))
        out[k].append(c)
        load[k] += c[3] + REQUEST.size
    return out


def fail_chunks(fail: list[TransferResult | None], chunks: Sequence[Chunk], status: int,
                message: str) -> None:
    for c in chunks:
        if fail[c[0]] is None:
            fail[c[0]] = TransferResult(status, message)


def finish(plan: Plan) -> list[TransferResult]:
    sums, receipts = plan.sums, plan.receipts
    return [r if r is not None else TransferResult(checksum=sums[i], receipt=receipts[i])
            for i, r in enumerate(plan.fail)]
