"""The shm transport on an asyncio loop: memcpy inline, COMMITs on the loop's sockets.

The AsyncClient's same-host data plane. Everything but the commits is `shm.ShmTransport`'s own
code, run inline on the loop thread: the checks, the mappings (cached, stat-checked, flock
probe), and the copies (`memcopy.Copier`: pieces of at most 4 MiB, the deadline checked before
each one, so one batch holds the loop for at most its budget plus one piece; large batches
split with a helper thread that the loop thread joins before returning). A write's COMMIT
frames go through an `AsyncTcpTransport` (`commit`), pipelined on the same channels the tcp
data plane uses, so the loop never blocks on a node's reply.

Cancellation guarantee: a read is a synchronous copy that ends before `read` returns (no task
is left behind); a write whose copy did not finish in time is never committed.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Sequence

from cellar.transfer.base import AsyncTransport, SegmentRoute, TransferOp, TransferResult
from cellar.transfer.control import ControlChannel
from cellar.transfer.memcopy import PARALLEL_MIN_BYTES
from cellar.transfer.shm import ShmTransport
from cellar.transfer.shm_commits import group_commits, with_digests
from cellar.transfer.tcp_async import AsyncTcpTransport


class AsyncShmTransport(AsyncTransport):
    """Same-host transfers through mapped segment files, from an event loop.

    host_id, parallel_min_bytes: as `ShmTransport`. control: the asyncio transport COMMITs go
    through (default: a new `AsyncTcpTransport`, closed with this one).
    """

    name = "shm"
    hashes_writes = True  # as ShmTransport
    reads_own_mapping = True  # as ShmTransport

    def __init__(self, *, host_id: str | None = None, control: AsyncTcpTransport | None = None,
                 parallel_min_bytes: int = PARALLEL_MIN_BYTES,
                 connect_timeout_s: float = 5.0,
                 tls_context: ssl.SSLContext | None = None) -> None:
        # The sync control channel is never used (it opens no socket until called).
        self._shm = ShmTransport(host_id=host_id, parallel_min_bytes=parallel_min_bytes,
                                 control=ControlChannel(connect_timeout_s=connect_timeout_s))
        self._own_control = control is None
        self._control = control or AsyncTcpTransport(connect_timeout_s=connect_timeout_s,
                                                     tls_context=tls_context)

    @property
    def stats(self) -> dict[str, int]:
        return self._shm.stats

    def can_reach(self, route: SegmentRoute) -> bool:
        return self._shm.can_reach(route)

    def forget(self, route: SegmentRoute) -> None:
        self._shm.forget(route)
        self._control.forget(route)

    async def read(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        return self._shm.read(ops, timeout_s)

    async def write(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        deadline = time.monotonic() + timeout_s
        plan = self._shm.plan_write(ops)
        claims, claimed = group_commits(plan.claims(ops))
        if claims:  # answered before any byte is copied (ShmTransport.write says why)
            self._shm.on_claims(ops, plan, claimed, await self._control.commit(
                claims, max(0.0, deadline - time.monotonic())))
        results, commits = self._shm.copy_write(ops, plan, deadline)
        with_digests(ops, results, commits)
        calls, which = group_commits(commits)
        replies: dict[str, list[tuple[int, str, bytes]]] = {}
        if calls:
            replies = await self._control.commit(calls, max(0.0, deadline - time.monotonic()))
        return self._shm.finish_write(ops, results, which, replies)

    async def aclose(self) -> None:
        self._shm.close()
        if self._own_control:
            await self._control.aclose()
