"""Buffers engines already own, through both faces and both transports on a real cluster: raw
pointers into registered memory, scatter-gather parts, torch tensors (when torch is installed),
`put_many(upsert=)`, and the client metrics the faces record."""

from __future__ import annotations

import ctypes
import urllib.request

import numpy as np
import pytest

import cellar
from cellar.client import metrics
from cellar.errors import Status
from tests.support.faces import FACE_TRANSPORT_IDS, FACE_TRANSPORTS, open_face

KIB = 1 << 10


@pytest.fixture(scope="module")
def cluster(module_cluster):
    return module_cluster(nodes=2, segment_size="64MiB", allow_unknown_tenants="true")


@pytest.fixture(params=FACE_TRANSPORTS, ids=FACE_TRANSPORT_IDS)
def client(request, cluster):
    c = open_face(*request.param, cluster.address, timeout_s=30.0,
                  tenant="buf-" + "-".join(request.param),
                  token=cluster.token_for("buf-" + "-".join(request.param), shm=True))
    yield c
    for prefix in ("ptr/", "sg/", "tn/", "up/", "m/"):
        c.remove_prefix(prefix)
    c.close()


def pattern(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_raw_pointers(client):
    pool = pattern(1, 256 * KIB)          # an engine's host KV pool
    out = np.zeros(256 * KIB, dtype=np.uint8)
    base, dst = pool.ctypes.data, out.ctypes.data
    client.register_buffer(base, pool.nbytes)
    client.register_buffer(dst, out.nbytes)
    client.put_from("ptr/a", base + 1000, 5000)
    assert client.get_into_ptr("ptr/a", dst, 8000) == 5000
    assert out[:5000].tobytes() == pool[1000:6000].tobytes() and not out[5000:8000].any()
    keys = [f"ptr/{i}" for i in range(8)]
    ptrs = [base + i * 16 * KIB for i in range(8)]
    assert client.put_many_from(keys, ptrs, [16 * KIB] * 8) == [Status.OK] * 8
    got = client.get_many_into_ptrs(keys + ["ptr/none"], [dst + i * 16 * KIB for i in range(9)],
                                    [16 * KIB] * 9, timeout_s=10.0)
    assert got == [16 * KIB] * 8 + [cellar.MISS]
    assert out[:128 * KIB].tobytes() == pool[:128 * KIB].tobytes()
    # refused before anything is sent: outside every registration, negative, too small
    with pytest.raises(cellar.InvalidArgument, match="outside every registered"):
        client.put_from("ptr/x", base + pool.nbytes - 10, 20)
    with pytest.raises(cellar.InvalidArgument, match="outside every registered"):
        client.get_into_ptr("ptr/a", dst - 64, 128)
    with pytest.raises(cellar.InvalidArgument):
        client.get_many_into_ptrs(["ptr/a"], [ctypes.addressof(ctypes.c_char()) ], [1])
    with pytest.raises(cellar.BufferTooSmall):
        client.get_into_ptr("ptr/a", dst, 100)
    assert not client.exists("ptr/x")
    client.unregister_buffer(base)
    with pytest.raises(cellar.InvalidArgument, match="not the start"):
        client.unregister_buffer(base)
    with pytest.raises(cellar.InvalidArgument, match="outside every registered"):
        client.put_from("ptr/y", base, 10)
    client.unregister_buffer(dst)


def test_scatter_gather_parts(client):
    k_layers = [pattern(10 + i, 3 * KIB) for i in range(4)]   # one page's K for 4 layers
    v_layers = [bytearray(pattern(20 + i, 3 * KIB).tobytes()) for i in range(4)]
    parts = [*k_layers, *v_layers]
    client.put_parts("sg/page", parts)
    whole = b"".join(bytes(memoryview(p)) for p in parts)
    assert client.get("sg/page") == whole
    back = [np.zeros(3 * KIB, dtype=np.uint8) for _ in range(8)]
    assert client.get_into_parts("sg/page", back) == len(whole)
    assert b"".join(b.tobytes() for b in back) == whole
    assert client.put_many_parts([("sg/a", [b"ab", b"cd"]), ("sg/b", [b"x" * 5000])]) == \
        [Status.OK, Status.OK]
    dests = [[bytearray(1), bytearray(3)], [bytearray(2500), bytearray(2500)], [bytearray(1)]]
    assert client.get_many_into_parts(["sg/a", "sg/b", "sg/none"], dests) == \
        [4, 5000, cellar.MISS]
    assert dests[0] == [bytearray(b"a"), bytearray(b"bcd")] and dests[1][1] == b"x" * 2500
    # parts that do not add up to the object: refused before any byte lands
    short = [bytearray(2), bytearray(1)]
    with pytest.raises(cellar.BufferTooSmall):
        client.get_into_parts("sg/a", short)
    assert short == [bytearray(2), bytearray(1)]
    long = [bytearray(b"\x07" * 3), bytearray(b"\x07" * 3)]
    with pytest.raises(cellar.InvalidArgument, match="add up"):
        client.get_into_parts("sg/a", long)
    assert long == [bytearray(b"\x07" * 3)] * 2
    for bad in ([], b"bytes", [b""]):
        with pytest.raises(cellar.InvalidArgument):
            client.put_parts("sg/bad", bad)
    assert not client.exists("sg/bad")


def test_put_many_upsert(client):
    assert client.put_many({"up/a": b"1", "up/b": b"2"}) == [Status.OK] * 2
    assert client.put_many({"up/a": b"3"}) == [Status.ALREADY_EXISTS]
    assert client.put_many({"up/a": b"33", "up/c": b"4"}, upsert=True) == [Status.OK] * 2
    assert client.get_many(["up/a", "up/b", "up/c"]) == [b"33", b"2", b"4"]


def test_tensors(client):
    torch = pytest.importorskip("torch")
    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    client.put_tensor("tn/a", t)
    back = client.get_tensor("tn/a")
    assert back.dtype == torch.float32 and back.shape == (2, 3, 4) and torch.equal(back, t)
    dest = torch.zeros(2, 3, 4)
    assert client.get_tensor_into("tn/a", dest) > t.nbytes and torch.equal(dest, t)
    bf = torch.ones(5, dtype=torch.bfloat16)
    assert client.put_tensors(["tn/b", "tn/c"], [bf, t[0].contiguous()]) == [Status.OK] * 2
    got = client.get_tensors(["tn/b", "tn/none", "tn/c"])
    assert got[1] is None and torch.equal(got[0], bf) and torch.equal(got[2], t[0])
    with pytest.raises(cellar.InvalidArgument, match="contiguous"):
        client.put_tensor("tn/bad", t.transpose(0, 2))
    with pytest.raises(cellar.InvalidArgument):
        client.get_tensor_into("tn/a", torch.zeros(3, 3))
    assert not client.exists("tn/bad")


def _sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_client_metrics_are_recorded_by_the_face(client):
    before = {op: _sample("cellar_client_requests_total", op=op)
              for op in ("get", "put", "exists", "prefix_len")}
    hits_before = _sample("cellar_client_key_hits_total", op="get")
    late_before = _sample("cellar_client_unused_keys_total", op="get", reason="deadline")
    client.put_many({"m/a": b"x" * 100, "m/b": b"y" * 50})
    assert client.get("m/a") == b"x" * 100
    assert client.get_many(["m/a", "m/none"]) == [b"x" * 100, None]
    assert client.get_many_into(["m/a"], [bytearray(100)], timeout_s=0) == [cellar.LATE]
    assert client.exists_many(["m/a", "m/none"]) == [True, False]
    assert client.prefix_len(["m/a", "m/b", "m/none"]) == 2
    assert _sample("cellar_client_requests_total", op="put") == before["put"] + 1
    assert _sample("cellar_client_requests_total", op="get") == before["get"] + 3
    assert _sample("cellar_client_requests_total", op="exists") == before["exists"] + 1
    assert _sample("cellar_client_requests_total", op="prefix_len") == before["prefix_len"] + 1
    assert _sample("cellar_client_key_hits_total", op="get") == hits_before + 2
    assert _sample("cellar_client_unused_keys_total", op="get", reason="deadline") == late_before
    port = metrics.serve_metrics(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        assert 'cellar_client_requests_total{op="prefix_len"}' in text
        assert "cellar_client_lookup_seconds_bucket" in text
    finally:
        metrics.stop_metrics_servers()
