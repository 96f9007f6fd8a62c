"""Both SDK faces against a TLS cluster (`LocalCluster(tls=True)`: a throwaway CA, the master's
gRPC port and its metadata fast line both over TLS; cellar.tls, docs/security.md).

put / get / exists / prefix_len over each face, twice: once with the metadata on
the fast line (checked: no gRPC call is made for them, and the line's connection is a TLS one),
once with the fast line off (checked: every call goes over gRPC). The master refuses plaintext
(tests/security/test_identity_tls.py), so an answer at all means the call was encrypted; the CA
and the token come from the credentials file the cluster wrote, as for a `cellar up --tls` user.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Iterator
from typing import Any

import pytest

from cellar.devtools.local_cluster import LocalCluster
from tests.support.faces import FACES, AsyncFace, connect_face

pytest.importorskip("cryptography")

VALUE_BYTES = 100_000


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "64MiB", tls=True) as cluster:
        yield cluster


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest, tls_cluster: LocalCluster) -> Iterator[Any]:
    client = connect_face(request.param, tls_cluster.address, transport="tcp", timeout_s=30.0)
    yield client
    client.close()


def _spy_grpc(face: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The methods the face's master channel sends over gRPC from now on."""
    calls: list[str] = []
    if isinstance(face, AsyncFace):
        channel = face.client._master
        real_async = channel._call_grpc

        async def spy_async(method: str, request: Any, deadline: float,
                            learn: bool = False) -> Any:
            calls.append(method)
            return await real_async(method, request, deadline, learn)

        monkeypatch.setattr(channel, "_call_grpc", spy_async)
    else:
        channel = face._master
        real = channel._call_grpc

        def spy(method: str, request: Any, deadline: float, learn: bool = False) -> Any:
            calls.append(method)
            return real(method, request, deadline, learn)

        monkeypatch.setattr(channel, "_call_grpc", spy)
    return calls


def _fast_line_is_tls(face: Any) -> bool:
    if isinstance(face, AsyncFace):
        line = face.client._master._fast
        pipes = [p for p in line._pipes if not p.down] if line is not None else []
        return bool(pipes) and all(p.transport.get_extra_info("ssl_object") is not None
                                   for p in pipes)
    line = face._master._fast
    idle = list(line._idle) if line is not None else []
    return bool(idle) and all(isinstance(sock, ssl.SSLSocket) for sock, _ in idle)


def _turn_fast_line_off(face: Any) -> None:
    if isinstance(face, AsyncFace):
        channel = face.client._master
        channel._fast = None  # and never learn it again: every call takes gRPC
        channel._fast_relearn_at = math.inf
    else:
        face._master._use_fast = False


def _round_trip(face: Any, tag: str) -> None:
    keys = [f"tls/{tag}/{i}" for i in range(3)]
    values = [bytes([i + 1]) * VALUE_BYTES for i in range(3)]
    face.put(keys[0], values[0])
    assert face.put_many(list(zip(keys[1:], values[1:], strict=True))) == [0, 0]
    assert face.get(keys[0]) == values[0]
    assert face.get_many(keys) == values
    assert face.exists(keys[2]) and not face.exists(f"tls/{tag}/absent")
    assert face.exists_many(keys + [f"tls/{tag}/absent"]) == [True, True, True, False]
    assert face.prefix_len(keys + [f"tls/{tag}/absent"] + keys) == 3
    assert face.remove_prefix(f"tls/{tag}/") == 3


def test_both_faces_over_the_fast_line_over_tls(tls_cluster: LocalCluster, face: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    face.exists("tls/warm")  # learns the fast line (one ClusterStatus over gRPC at most)
    grpc_calls = _spy_grpc(face, monkeypatch)
    _round_trip(face, "fast")
    # every put/get/exists/prefix_len call rode the fast line (RemovePrefix has no fast form)
    assert set(grpc_calls) <= {"RemovePrefix"}, grpc_calls
    assert _fast_line_is_tls(face)


def test_both_faces_over_grpc_over_tls(tls_cluster: LocalCluster, face: Any,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _turn_fast_line_off(face)
    grpc_calls = _spy_grpc(face, monkeypatch)
    _round_trip(face, "grpc")
    for method in ("PutStart", "PutEnd", "GetReplicas", "Exists", "PrefixLen", "RemovePrefix"):
        assert method in grpc_calls, (method, grpc_calls)
