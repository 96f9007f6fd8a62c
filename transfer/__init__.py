"""cellar.transfer: the data plane. Payload bytes move here and nowhere else.

One frame format (`frame`: a fixed little-endian request header carrying the master's grant,
optional meta, then the payload), one client interface (`base.Transport`: batched reads and
writes of (remote range, local buffer) pairs with one `TransferResult` per op, in input order),
and one server-side hook that storage nodes implement (`base.SegmentAccess`: turn a checked
request into a memoryview of segment memory).

Transports:
- `tcp` (`tcp.TcpTransport`, served by `tcp_server.TcpDataServer`): always available;
  persistent connections per node, large objects striped over several connections, pipelined
  requests, `recv_into`/`sendmsg` straight between sockets and the caller's or the segment's
  memory, never an intermediate bytes object for a payload; reads hashed as they land
  (`tcp_reads`), a read batch on fewer lanes than a write on a small machine.
- `shm` (`shm.ShmTransport`): same host; memcpy into/out of the node's mapped segment file,
  then a COMMIT control frame per write over the node's TCP port (`control.ControlChannel`;
  `shm_commits`: planned per batch, sent in groups while the rest is still copied).
- `rdma` (`rdma.RdmaTransport` over the small verbs interface in `verbs`): one-sided RDMA
  READ/WRITE on RC queue pairs, COMMIT like shm; only where pyverbs and a device exist.
TLS (optional, per node): a node with a certificate advertises its tcp endpoint as
`tls://HOST:PORT`; tcp, tcp_async and the COMMIT line (`control`) then speak TLS to it,
verified with the `tls_context` option (the master's CA), never falling back to plaintext
(`tls_sock`: contexts and `TlsSocket`; `tls_async`: the asyncio handshake).
Each registers in `_FACTORIES` below, so `make_transport` and the SDK never special-case one.
The asyncio forms (`base.AsyncTransport`, for the AsyncClient) register in `_ASYNC_FACTORIES`:
`tcp_async.AsyncTcpTransport` (the loop's own non-blocking sockets, same frames, pipelined,
pooled, scatter-gather) and `shm_async.AsyncShmTransport` (memcpy inline, COMMITs on the loop).
rdma has no asyncio form yet: opening it raises `TransportUnavailable`.
`open_transports(choice)` / `open_async_transports(choice)` open what a client's
`transport=` choice asks for ("auto": every one this machine has, best first; a name: that one).

Scatter-gather: an op's `parts` (several local buffers, one remote range) move with no staging
copy: tcp hands them to sendmsg/recvmsg_into as iovecs, shm copies part by part; chunks and
stripes may cross part boundaries; checksums stream over the parts (`base.hash_views`).

A write op may be split into several frames; every frame carries the op's WriteMeta and the
node's `SegmentAccess.written` is called once per frame that fully arrived.

Dependencies: this package may import `cellar.proto` (grants) and nothing else of Cellar; it
never imports `cellar.client`, `cellar.master` or `cellar.storage_node`, so a prefill worker can
use it on its own to write a KV block straight into another process's registered buffer.
Import rule: may import only cellar.proto.*
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_CONNECTION_LOST,
    ST_TIMEOUT,
    AsyncTransport,
    SegmentAccess,
    SegmentRoute,
    TransferOp,
    TransferResult,
    Transport,
    TransportUnavailable,
    hash_views,
    op_nbytes,
    op_views,
)
from cellar.transfer.frame import FrameError, WriteMeta


def _tcp(**options: Any) -> Transport:
    from cellar.transfer.tcp import TcpTransport

    return TcpTransport(**options)


def _shm(**options: Any) -> Transport:
    from cellar.transfer.shm import ShmTransport

    return ShmTransport(**options)


def _rdma(*, spin: Any = None, **options: Any) -> Transport:
    from cellar.transfer.rdma import RdmaTransport

    return RdmaTransport(**options)  # raises RdmaUnavailable without pyverbs or a device


# name -> factory(**options). Each transport adds one line.
_FACTORIES: dict[str, Callable[..., Transport]] = {"tcp": _tcp, "shm": _shm, "rdma": _rdma}


def _tcp_async(**options: Any) -> AsyncTransport:
    from cellar.transfer.tcp_async import AsyncTcpTransport

    return AsyncTcpTransport(**options)


def _shm_async(**options: Any) -> AsyncTransport:
    from cellar.transfer.shm_async import AsyncShmTransport

    return AsyncShmTransport(**options)


def _rdma_async(**options: Any) -> AsyncTransport:
    raise TransportUnavailable("rdma has no asyncio transport yet (use the sync Client)")


_ASYNC_FACTORIES: dict[str, Callable[..., AsyncTransport]] = {
    "tcp": _tcp_async, "shm": _shm_async, "rdma": _rdma_async}

# What "auto" opens, best first (per replica the first that can reach it wins): shm (same
# host, file opens), rdma (a device here and on the node), tcp (always).
AUTO_ORDER = ("shm", "rdma", "tcp")


def available_transports() -> list[str]:
    return sorted(_FACTORIES)


def make_transport(name: str, **options: Any) -> Transport:
    """A new transport by name ("tcp"); ValueError naming the available ones otherwise."""
    return _make(_FACTORIES, name, options)


def make_async_transport(name: str, **options: Any) -> AsyncTransport:
    """A new asyncio transport by name; ValueError if unknown, TransportUnavailable if it has
    no asyncio form or cannot open here."""
    return _make(_ASYNC_FACTORIES, name, options)


def open_transports(choice: str, **options: Any) -> list[Transport]:
    """The transports `transport=choice` asks for, in preference order. "auto": every one of
    AUTO_ORDER that opens here (tcp must); a name: just that one. ValueError for an unknown
    choice; TransportUnavailable (naming the cause) if a required one cannot open."""
    return _open(_FACTORIES, choice, options, lambda t: t.close())


def open_async_transports(choice: str, **options: Any) -> list[AsyncTransport]:
    """`open_transports` for an event loop (rdma: TransportUnavailable when named; skipped by
    "auto"). Call it anywhere: an asyncio transport opens no socket until its first batch,
    so one that is dropped because a later one failed to open holds nothing to release."""
    return _open(_ASYNC_FACTORIES, choice, options, lambda t: None)


_T = TypeVar("_T")


def _make(factories: dict[str, Callable[..., _T]], name: str, options: dict[str, Any]) -> _T:
    factory = factories.get(name)
    if factory is None:
        raise ValueError(f"unknown transport {name!r}; available: {', '.join(sorted(factories))}")
    return factory(**options)


def _open(factories: dict[str, Callable[..., _T]], choice: str, options: dict[str, Any],
          close: Callable[[_T], None]) -> list[_T]:
    if choice == "auto":
        names: tuple[str, ...] = AUTO_ORDER
    elif choice in factories:
        names = (choice,)
    else:
        raise ValueError(f"unknown transport {choice!r}; use 'auto' or one of "
                         f"{', '.join(sorted(factories))}")
    opened: list[_T] = []
    for name in names:
        try:
            opened.append(factories[name](**options))
        except Exception as exc:
            if choice == "auto" and name != names[-1]:
                continue  # an optional transport this machine lacks (e.g. no RDMA device)
            for t in opened:
                close(t)
            if isinstance(exc, TransportUnavailable):
                raise
            raise TransportUnavailable(f"transport {name!r} is not available here: "
                                       f"{exc}") from exc
    return opened


__all__ = [
    "AUTO_ORDER", "ST_CONNECTION_LOST", "ST_CONNECT_FAILED", "ST_TIMEOUT", "AsyncTransport",
    "FrameError", "SegmentAccess", "SegmentRoute", "TransferOp", "TransferResult", "Transport",
    "TransportUnavailable", "WriteMeta", "available_transports", "hash_views",
    "make_async_transport", "make_transport", "op_nbytes", "op_views", "open_async_transports",
    "open_transports",
]
