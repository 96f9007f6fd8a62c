"""A node's call writes the bounds it queued behind its reply; a client's change waits for them.

Found by `cellar soak --ha` (2026-12-06): puts stalled by an etcd outage timed out, the ticker
dropped them and queued their dead writes, and the next request to come (a node's heartbeat)
waited for the removal log to take them; with etcd SIGSTOPped the heartbeat hung, its node took the timeout for a lost master and went to etcd for the leader,
and the leader found its nodes SUSPECT and refused puts for want of live nodes. The servicer's
real gRPC handlers (no server: a stand-in context), a removal log that blocks until released.
"""

from __future__ import annotations

import asyncio
from typing import Any

from test_master_support import SECRET, mount, put, put_start

from cellar.master.config import MasterConfig
from cellar.master.serving.auth import Authorizer
from cellar.master.serving.leadership import Leadership
from cellar.master.serving.servicer import MasterServicer
from cellar.master.state.tombstones import DEAD_WRITE
from cellar.proto import cellar_pb2 as pb
from cellar.tokens import TokenStore


class _HeldLog:
    """A removal log whose appends wait until `release` (etcd SIGSTOPped, then back)."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.written: list[Any] = []

    async def append(self, records: list[Any], snapshot: Any) -> None:
        await self.released.wait()
        self.written += records


class _Context:
    """What the handlers use of grpc.aio.ServicerContext."""

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass


def test_a_heartbeat_answers_while_its_bounds_are_written_behind_it() -> None:
    leadership = Leadership(MasterConfig(new_node_ramp_s=0.0), SECRET, ha=False)
    log = _HeldLog()
    leadership.removal_log = log  # type: ignore[assignment]
    servicer = MasterServicer(leadership, Authorizer(TokenStore(None), SECRET))
    service = leadership.service
    mount(service, "n1", 1)
    put(service, "kept", 4096)
    put_start(service, "unfinished", 4096)  # PutStart, no PutEnd: WRITING on n1
    # the ticker's sweep, past the write grant's life: the put is dropped, its dead write queued
    assert service.objects.sweep_writers(service.clock.monotonic() + 3600) == 1
    assert leadership.durable_due("Heartbeat")  # whoever asks next takes it to the log
    heartbeat = servicer.method_handlers()["Heartbeat"].unary_unary
    get = servicer.method_handlers()["GetReplicas"].unary_unary

    async def scenario() -> None:
        request = pb.HeartbeatRequest(node_id="n1", incarnation=1)
        reply = await asyncio.wait_for(heartbeat(request, _Context()), 5)  # not held by the log
        assert not reply.remount
        assert log.written == []  # the dead write is still on its way
        assert not leadership.durable_due("GetReplicas")  # taken: written once, by the heartbeat
        got = await asyncio.wait_for(get(pb.GetReplicasRequest(keys=["kept"]), _Context()), 5)
        assert got.results[0].status == pb.OK
        assert "unfinished" not in service.tenant("").writing
        log.released.set()
        for _ in range(100):
            if log.written:
                break
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert [(key, kind) for _tenant, key, _alloc, kind in log.written] == [
        ("unfinished", DEAD_WRITE)]
    assert "kept" in service.tenant("").objects
