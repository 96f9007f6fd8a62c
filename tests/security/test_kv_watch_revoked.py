"""Finding (review 2026-12-07): a revoked token kept reading its tenant's KV events.

`WatchKvEvents` (master/serving/kv_stream.py) checked the caller's token once, when the stream
opened, and then served every later batch of the tenant for as long as the stream lived: a
token revoked through the admin API (a leaked one, a departed user's) still saw every key hash
the tenant stored or dropped afterwards, until the connection's maximum age. Now the token is
checked again before each round of batches, and a refused one ends the stream with the
refusal's code.

Real master process with KV events on (cellar.devtools.local_cluster); the put that makes the
batch uses another token of the same tenant.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import cellar
from cellar.devtools.etcd_server import free_port
from cellar.devtools.local_cluster import LocalCluster
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.tokens import token_id_of

pytest.importorskip("zmq")
pytest.importorskip("msgspec")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "32MiB", master_flags={
            "kv_events_bind": f"tcp://127.0.0.1:{free_port()}",
            "kv_events_replay_bind": f"tcp://127.0.0.1:{free_port()}"}) as c:
        yield c


def _reader(stream: Any) -> queue.Queue[Any]:
    """Each batch of `stream`, then the RpcError that ended it (or None at its end)."""
    out: queue.Queue[Any] = queue.Queue()

    def read() -> None:
        try:
            for batch in stream:
                out.put(batch)
            out.put(None)
        except grpc.RpcError as exc:
            out.put(exc)

    threading.Thread(target=read, daemon=True).start()
    return out


def test_a_revoked_token_stops_receiving_events(cluster: LocalCluster) -> None:
    writer_token = cluster.token_for("carol")
    watcher_token = cluster.token_for("carol")
    watcher_id = token_id_of(watcher_token)
    with grpc.insecure_channel(cluster.address) as channel, \
            cellar.connect(cluster.address, tenant="carol", token=writer_token,
                           timeout_s=30.0) as writer:
        stream = pb_grpc.MasterStub(channel).WatchKvEvents(pb.KvEventsRequest(
            header=pb.RequestHeader(tenant="carol", token=watcher_token)))
        seen = _reader(stream)
        writer.put("before", b"x")
        first = seen.get(timeout=30)
        assert isinstance(first, pb.KvEventBatch), first  # the stream works while the token does

        cluster.admin_request("POST", "/api/v1/tokens/revoke", {"id": watcher_id})
        writer.put("after", b"y")
        writer.put("after-2", b"z")
        try:
            ending = seen.get(timeout=30)
        finally:
            stream.cancel()
        assert isinstance(ending, grpc.RpcError), "a revoked token was sent a later batch"
        assert ending.code() == grpc.StatusCode.UNAUTHENTICATED
