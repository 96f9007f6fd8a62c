"""The master's metadata fast line (cellar.master.fastrpc) and the SDK's use of it.

It must answer exactly what gRPC answers (same messages, same error codes), and a client whose
fast line fails must carry on over gRPC without the caller noticing.
"""

from __future__ import annotations

import socket
import time

import grpc
import pytest
from master_harness import admin_header, running_master

from cellar.client import rpc
from cellar.errors import InvalidArgument, Timeout, Unavailable
from cellar.master import fastrpc
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc

HEADER = admin_header("default", "fast-line-test")


def deadline(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


def test_constants_match_the_master() -> None:
    assert rpc.FAST_PORT_METADATA == fastrpc.FAST_PORT_METADATA
    assert rpc.FAST_FRAME.format == fastrpc.FRAME.format
    assert {name: number for name, (number, _) in rpc.FAST_METHODS.items()} == fastrpc.METHOD_IDS


def test_cluster_status_advertises_the_port_and_calls_use_it() -> None:
    with running_master() as master:
        channel = rpc.MasterChannel(master.grpc_address)
        try:
            channel.call("ClusterStatus", pb.ClusterStatusRequest(header=HEADER), deadline())
            line = channel._fast
            assert line is not None and line.address[1] > 0
            reply = channel.call("GetReplicas", pb.GetReplicasRequest(header=HEADER, keys=["nope"]),
                                 deadline())
            assert [r.status for r in reply.results] == [pb.NOT_FOUND]
            assert reply.header.epoch == master.epoch
            assert channel._fast is line  # still up: the call went over it
        finally:
            channel.close()


def test_same_reply_and_error_codes_as_grpc() -> None:
    with running_master("--max-batch-keys", "4") as master:
        channel = rpc.MasterChannel(master.grpc_address)
        stub = cellar_pb2_grpc.MasterStub(grpc.insecure_channel(master.grpc_address))
        try:
            channel.call("ClusterStatus", pb.ClusterStatusRequest(header=HEADER), deadline())
            assert channel._fast is not None
            request = pb.GetReplicasRequest(header=HEADER, keys=["a", "b"])
            fast_reply = channel.call("GetReplicas", request, deadline())
            grpc_reply = stub.GetReplicas(request)
            assert list(fast_reply.results) == list(grpc_reply.results)
            too_many = pb.GetReplicasRequest(header=HEADER, keys=list("abcdefgh"))
            with pytest.raises(grpc.RpcError) as grpc_error:
                stub.GetReplicas(too_many)
            assert grpc_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(InvalidArgument):
                channel.call("GetReplicas", too_many, deadline())
            assert channel._fast is not None  # an error reply is not a broken line
        finally:
            channel.close()


def test_refused_fast_line_falls_back_to_grpc() -> None:
    with running_master() as master:
        channel = rpc.MasterChannel(master.grpc_address)
        try:
            channel.call("ClusterStatus", pb.ClusterStatusRequest(header=HEADER), deadline())
            closed = socket.socket()
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]
            closed.close()  # nothing listens there now
            channel._fast = rpc._FastLine("127.0.0.1", port)
            reply = channel.call("GetReplicas", pb.GetReplicasRequest(header=HEADER, keys=["k"]),
                                 deadline())
            assert [r.status for r in reply.results] == [pb.NOT_FOUND]
            assert channel._fast is None  # dropped; asked for again after FAST_RELEARN_S
            channel._fast_relearn_at = 0.0
            channel.call("Unpin", pb.UnpinRequest(header=HEADER, pin_ids=[]), deadline())
            assert channel._fast is not None and channel._fast.address[1] != port
        finally:
            channel.close()


def test_master_gone_raises_instead_of_hanging() -> None:
    with running_master() as master:
        channel = rpc.MasterChannel(master.grpc_address)
        channel.call("ClusterStatus", pb.ClusterStatusRequest(header=HEADER), deadline())
        request = pb.GetReplicasRequest(header=HEADER, keys=["k"])
        channel.call("GetReplicas", request, deadline())
    try:
        with pytest.raises((Unavailable, Timeout)):
            channel.call("GetReplicas", request, deadline(1.0))
        assert channel._fast is None
    finally:
        channel.close()
