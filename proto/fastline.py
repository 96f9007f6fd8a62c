"""The master's metadata fast line as a wire contract: frame layout and method table.

The fast line (served by `cellar.master.fastrpc`, used by the SDK's channels) carries the
hottest master RPCs as the gRPC API's own protobuf messages over persistent TCP, without
gRPC's per-call machinery. Master and client both import this module, so the frame and the
method numbers exist once (they used to be two copies kept equal by a test).

Frames (little-endian)
    request = u32 body length | u8 method | body (serialized request message)
    reply   = u32 body length | u8 code   | body (serialized reply if code is 0, else UTF-8
              details); code is the numeric gRPC status code the gRPC path would have used.

Methods
    A number is never reused for another RPC: a client and a master of different versions
    must agree on each number they both know. An unknown number closes the connection and
    the client sends that call over gRPC.
"""

from __future__ import annotations

import struct
from typing import Any

from cellar.proto import cellar_pb2 as pb

PORT_METADATA = "cellar-fast-rpc-port"  # ClusterStatus trailing metadata naming the port
FRAME = struct.Struct("<IB")            # body length (bytes), method or status code
OK_CODE = 0

# number -> (RPC name, reply message class). Exists, PrefixLen and Lookup are here because
# engines ask them on every request's critical path (256 keys within 0.3 ms).
METHODS: dict[int, tuple[str, Any]] = {
    1: ("PutStart", pb.PutStartReply),
    2: ("PutEnd", pb.PutEndReply),
    3: ("PutRevoke", pb.PutRevokeReply),
    4: ("GetReplicas", pb.GetReplicasReply),
    5: ("Unpin", pb.UnpinReply),
    6: ("Exists", pb.ExistsReply),
    7: ("PrefixLen", pb.PrefixLenReply),
    8: ("Lookup", pb.LookupReply),
}
METHOD_NAMES: dict[int, str] = {number: name for number, (name, _) in METHODS.items()}
METHOD_IDS: dict[str, int] = {name: number for number, name in METHOD_NAMES.items()}
REPLY_TYPES: dict[str, Any] = {name: reply for name, reply in METHODS.values()}

assert FRAME.size == 5 and len(METHOD_IDS) == len(METHODS), "fast line table is inconsistent"


def pack_head(length: int, method_or_code: int) -> bytes:
    assert 0 <= length < 1 << 32 and 0 <= method_or_code < 256, (length, method_or_code)
    return FRAME.pack(length, method_or_code)
