"""Exists and PrefixLen over the master's fast line (cellar.proto.fastline): the same answers
as gRPC, and they really take the fast line (gRPC is not called for them)."""

from __future__ import annotations

import time

import grpc
from master_harness import admin_header, running_master

from cellar.client import rpc
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc, fastline

HEADER = admin_header("default", "fast-probe-test")


def soon(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


def test_the_contract_numbers_exists_and_prefix_len():
    assert fastline.METHOD_IDS["Exists"] == 6 and fastline.METHOD_IDS["PrefixLen"] == 7
    assert rpc.FAST_METHODS["Exists"][1] is pb.ExistsReply


def test_exists_and_prefix_len_take_the_fast_line_and_match_grpc(monkeypatch):
    with running_master("--max-batch-keys", "4") as master:
        channel = rpc.MasterChannel(master.grpc_address)
        stub = cellar_pb2_grpc.MasterStub(grpc.insecure_channel(master.grpc_address))  # HEADER carries the token
        try:
            channel.call("ClusterStatus", pb.ClusterStatusRequest(header=HEADER), soon())
            assert channel._fast is not None
            request = pb.KeysRequest(header=HEADER, keys=["a", "b", "c"])
            channel.call("Exists", request, soon())  # waits out the master's rebuild grace
            grpc_calls: list[str] = []
            real = channel._call_grpc

            def spy(method, request, deadline, learn=False):
                grpc_calls.append(method)
                return real(method, request, deadline, learn)

            monkeypatch.setattr(channel, "_call_grpc", spy)
            request = pb.KeysRequest(header=HEADER, keys=["a", "b", "c"])
            fast_exists = channel.call("Exists", request, soon())
            fast_prefix = channel.call("PrefixLen", request, soon())
            assert grpc_calls == []
            assert list(fast_exists.statuses) == list(stub.Exists(request).statuses)
            assert list(fast_exists.statuses) == [pb.NOT_FOUND] * 3
            assert fast_prefix.prefix_len == stub.PrefixLen(request).prefix_len == 0
            bad = pb.KeysRequest(header=HEADER, keys=["a", "b", "c", "d", "e"])  # over the batch limit
            errors = []
            for call in (lambda: channel.call("Exists", bad, soon()),
                         lambda: stub.Exists(bad)):
                try:
                    call()
                except Exception as exc:  # noqa: BLE001 - compared below
                    errors.append(type(exc).__name__)
            assert errors[0] == "InvalidArgument" and errors[1] == "_InactiveRpcError"
            assert grpc_calls == []
        finally:
            channel.close()
