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
  memory, never an intermediate bytes object for a payload.
- `shm` (`shm.ShmTransport`): same host; memcpy into/out of the node's mapped segment file,
  then a COMMIT control frame per write over the node's TCP port (`control.ControlChannel`).
- `rdma` (`rdma.RdmaTransport` over the small verbs interface in `verbs`): one-sided RDMA
  READ/WRITE on RC queue pairs, COMMIT like shm; only where pyverbs and a device exist.
Each registers in `_FACTORIES` below, so `make_transport` and the SDK never special-case one.

A write op may be split into several frames; every frame carries the op's WriteMeta and the
node's `SegmentAccess.written` is called once per frame that fully arrived.

Dependencies: this package may import `cellar.proto` (grants) and nothing else of Cellar; it
never imports `cellar.client`, `cellar.master` or `cellar.storage_node`, so a prefill worker can
use it on its own to write a KV block straight into another process's registered buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_CONNECTION_LOST,
    ST_TIMEOUT,
    SegmentAccess,
    SegmentRoute,
    TransferOp,
    TransferResult,
    Transport,
)
from cellar.transfer.frame import FrameError, WriteMeta


def _tcp(**options: Any) -> Transport:
    from cellar.transfer.tcp import TcpTransport

    return TcpTransport(**options)


def _shm(**options: Any) -> Transport:
    from cellar.transfer.shm import ShmTransport

    return ShmTransport(**options)


def _rdma(**options: Any) -> Transport:
    from cellar.transfer.rdma import RdmaTransport

    return RdmaTransport(**options)  # raises RdmaUnavailable without pyverbs or a device


# name -> factory(**options). Each transport adds one line.
_FACTORIES: dict[str, Callable[..., Transport]] = {"tcp": _tcp, "shm": _shm, "rdma": _rdma}


def available_transports() -> list[str]:
    return sorted(_FACTORIES)


def make_transport(name: str, **options: Any) -> Transport:
    """A new transport by name ("tcp"); ValueError naming the available ones otherwise."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown transport {name!r}; available: "
                         f"{', '.join(available_transports())}")
    return factory(**options)


__all__ = [
    "ST_CONNECTION_LOST", "ST_CONNECT_FAILED", "ST_TIMEOUT", "FrameError", "SegmentAccess",
    "SegmentRoute", "TransferOp", "TransferResult", "Transport", "WriteMeta",
    "available_transports", "make_transport",
]
