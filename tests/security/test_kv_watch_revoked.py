"""Findings (review 2026-12-07) on the authenticated KV event stream, `WatchKvEvents`.

A revoked token kept reading its tenant's KV events.

`WatchKvEvents` (master/serving/kv_stream.py) checked the caller's token once, when the stream
opened, and then served every later batch of the tenant for as long as the stream lived: a
token revoked through the admin API (a leaked one, a departed user's) still saw every key hash
the tenant stored or dropped afterwards, until the connection's maximum age. Now the token is
checked again before each round of batches, and a refused one ends the stream with the
refusal's code.

A tenant could open any number of streams (256 per gRPC connection, 512 connections), each one
held by the master for ever and each woken, and its tenant's retained batches filtered, on
every flush of the master's loop. Now at most `kv_events_max_streams_per_tenant` are open per
tenant; one more is RESOURCE_EXHAUSTED, and a closed stream frees its place.

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
from cellar.master.serving.kv_events import key_hash
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.tokens import token_id_of

MAX_STREAMS = 4
pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "32MiB", master_flags={
            "kv_events_bind": f"tcp://127.0.0.1:{free_port()}",
            "kv_events_replay_bind": f"tcp://127.0.0.1:{free_port()}",
            "kv_events_max_streams_per_tenant": MAX_STREAMS}) as c:
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


def _next(out: queue.Queue[Any], put: Any) -> Any:
    """The stream's next item, putting keys until one comes: a stream is served from the
    batch after the last one flushed when the master opened it, which may follow a put made
    just after the call."""
    for attempt in range(60):
        put(attempt)
        try:
            return out.get(timeout=0.5)
        except queue.Empty:
            continue
    return out.get(timeout=30)


def _hashes(batch: pb.KvEventBatch) -> list[int]:
    _ts, events, _rank = msgspec.msgpack.decode(batch.payload)
    return [h for event in events if event[0] == "BlockStored" for h in event[1]]


def _until_refused(out: queue.Queue[Any]) -> Any:
    """The error that ended the stream, past the batches still queued before it."""
    item = out.get(timeout=30)
    while isinstance(item, pb.KvEventBatch):
        item = out.get(timeout=30)
    return item


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
        first = _next(seen, lambda i: writer.put(f"before-{i}", b"x"))
        assert isinstance(first, pb.KvEventBatch), first  # the stream works while the token does

        cluster.admin_request("POST", "/api/v1/tokens/revoke", {"id": watcher_id})
        writer.put("after", b"y")
        try:
            ending = seen.get(timeout=30)
            while isinstance(ending, pb.KvEventBatch):  # batches of puts before the revocation
                assert key_hash("after") not in _hashes(ending), "a revoked token read on"
                ending = seen.get(timeout=30)
        finally:
            stream.cancel()
        assert isinstance(ending, grpc.RpcError), ending
        assert ending.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_tenant_holds_at_most_its_streams(cluster: LocalCluster) -> None:
    token = cluster.token_for("dave")
    other = cluster.token_for("erin")
    with grpc.insecure_channel(cluster.address) as channel, \
            cellar.connect(cluster.address, tenant="dave", token=token, timeout_s=30.0) as dave:
        stub = pb_grpc.MasterStub(channel)

        def watch(tenant: str, with_token: str) -> Any:
            return stub.WatchKvEvents(pb.KvEventsRequest(
                header=pb.RequestHeader(tenant=tenant, token=with_token)))

        held = [watch("dave", token) for _ in range(MAX_STREAMS)]
        outs = [_reader(s) for s in held]
        for n, out in enumerate(outs):  # every held stream is open and serving
            assert isinstance(_next(out, lambda i, n=n: dave.put(f"one-{n}-{i}", b"x")),
                              pb.KvEventBatch)
        extra = watch("dave", token)
        extra_out = _reader(extra)
        dave.put("extra", b"x")  # a batch it would be sent if it were open
        try:
            refused = extra_out.get(timeout=30)
        finally:
            extra.cancel()
        assert isinstance(refused, grpc.RpcError), "one stream more than the limit was served"
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # another tenant is not limited by dave's streams
        erins = watch("erin", other)
        erin_out = _reader(erins)
        with cellar.connect(cluster.address, tenant="erin", token=other, timeout_s=30.0) as erin:
            got = _next(erin_out, lambda i: erin.put(f"e-{i}", b"x"))
        try:
            assert isinstance(got, pb.KvEventBatch)
        finally:
            erins.cancel()
        # a closed stream frees its place
        held[0].cancel()
        assert isinstance(_until_refused(outs[0]), grpc.RpcError)  # CANCELLED, on the client
        for attempt in range(50):  # the master sees the cancel soon after the client does
            again = watch("dave", token)
            got = _next(_reader(again), lambda i, a=attempt: dave.put(f"two-{a}-{i}", b"y"))
            again.cancel()
            if isinstance(got, pb.KvEventBatch):
                break
            assert got.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        else:
            raise AssertionError("the closed stream's place never came back")
        for stream in held[1:]:
            stream.cancel()
