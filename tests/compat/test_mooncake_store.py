"""Every MooncakeDistributedStore method against a real cluster on loopback: results and codes
as Mooncake returns them, zero-copy through registered ctypes buffers, scatter/gather and
ranged reads with both overflows refused."""

from __future__ import annotations

import ctypes
import os
import re
import uuid

import pytest
from mooncake_helpers import OTHER_TENANT, setup_args

from cellar.compat.mooncake import MooncakeDistributedStore, ReplicateConfig
from cellar.compat.mooncake.codes import ErrorCode

OK, NOT_FOUND, INVALID = 0, -704, -600
NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)
KIB = 1 << 10


def k(name: str) -> str:
    """A key unique to this test run (the module shares one cluster)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_setup_forms_and_refusals(mc_cluster):
    store = MooncakeDistributedStore()
    assert store.health_check() == 1  # not set up
    assert store.put("x", b"y") == INVALID and store.get("x") == b""
    assert store.setup(*setup_args(mc_cluster, local_buffer="50%")) == INVALID
    assert store.setup(*setup_args(mc_cluster, protocol="nvlink")) == NOT_SUPPORTED
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "tcp", "", "not an address") == INVALID
    assert store.setup(*setup_args(mc_cluster)) == OK
    assert store.setup(*setup_args(mc_cluster)) == INVALID  # already set up
    assert store.health_check() == 0
    host, port = store.get_hostname().split(":")  # Mooncake's "host:port", a port it picked
    assert host == "127.0.0.1" and 12300 <= int(port) <= 14300
    assert store.close() == 0 and store.close() == 0
    assert store.health_check() == 1

    by_dict = MooncakeDistributedStore()
    assert by_dict.setup({"local_hostname": "127.0.0.1", "metadata_server": "http://meta/x",
                          "global_segment_size": "0", "local_buffer_size": "16 MB",
                          "protocol": "tcp", "master_server_addr": mc_cluster.address}) == OK
    key = k("dict")
    assert by_dict.put(key, b"v") == OK and by_dict.get(key) == b"v"
    by_dict.close()
    assert MooncakeDistributedStore().setup({"local_hostname": "h"}) == INVALID

    dummy = MooncakeDistributedStore()
    assert dummy.setup_dummy(1 << 20, 16 << 20, mc_cluster.address) == OK
    assert dummy.get(key) == b"v"
    dummy.close()


def test_unreachable_master_is_rpc_fail():
    store = MooncakeDistributedStore()
    store.client_timeout_s = 1.0
    # port 1 on loopback: nothing listens, the connect fails within the client's timeout
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "tcp", "", "127.0.0.1:1") in (
        int(ErrorCode.RPC_FAIL), int(ErrorCode.RPC_TIMEOUT))


def test_bytes_api(new_store):
    store = new_store()
    key = k("bytes")
    assert store.put(key, b"hello") == OK
    assert store.put(key, b"other") == OK            # existing key: success, value kept
    assert store.get(key) == b"hello"
    assert store.upsert(key, b"replaced!") == OK
    assert store.get(key) == b"replaced!" and store.get_size(key) == 9
    assert store.is_exist(key) == 1 and store.is_exist(k("none")) == 0
    assert store.get(k("none")) == b"" and store.get_size(k("none")) == NOT_FOUND
    assert store.put("", b"x") == INVALID and store.put(k("empty"), b"") == INVALID

    keys = [k(f"b{i}") for i in range(5)]
    values = [os.urandom(100 + i) for i in range(5)]
    assert store.put_batch(keys, values) == OK
    assert store.get_batch(keys + [k("none")]) == values + [b""]
    assert store.batch_is_exist(keys + [k("none")]) == [1] * 5 + [0]
    assert store.upsert_batch(keys[:2], [b"n0", b"n1"]) == OK
    assert store.get_batch(keys[:3]) == [b"n0", b"n1", values[2]]
    assert store.put_batch(keys[:2], [b"x"]) == INVALID  # lengths differ

    parts_key = k("parts")
    assert store.put_parts(parts_key, b"ab", bytearray(b"cd"), memoryview(b"ef")) == OK
    assert store.get(parts_key) == b"abcdef"
    assert store.upsert_parts(parts_key, b"1", b"23") == OK and store.get(parts_key) == b"123"

    assert store.remove(key) == OK and store.remove(key) == NOT_FOUND
    assert store.get(key) == b""
    assert store.batch_remove([keys[0], keys[0]]) == [OK, NOT_FOUND]


def test_local_buffer_bounds_non_zero_copy_puts(new_store, buffers):
    store = new_store(local_buffer=1 * KIB)
    key = k("lb")
    assert store.put(key, b"x" * KIB) == OK
    assert store.put(k("lb"), b"x" * (KIB + 1)) == INVALID
    assert store.put_batch([k("a"), k("b")], [b"1", b"2" * (KIB + 1)]) == INVALID
    zero = new_store(local_buffer=0)
    assert zero.put(k("z"), b"x") == INVALID and zero.upsert(k("z"), b"x") == INVALID
    assert zero.get(key) == b"x" * KIB  # gets need no staging buffer in Cellar
    # zero-copy puts do not stage, so the local buffer does not bound them (as in Mooncake)
    src = buffers.make(4 * KIB, b"z" * 4 * KIB)
    assert zero.register_buffer(buffers.ptr(src), 4 * KIB) == OK
    assert zero.put_from(k("zc"), buffers.ptr(src), 4 * KIB) == OK


def test_replicate_config(new_store, mc_cluster, connect_to):
    store = new_store()
    admin = connect_to(mc_cluster)

    def replicas_stored() -> int:
        return sum(seg["object_count"] for seg in admin.status()["segments"])

    cfg = ReplicateConfig()
    cfg.replica_num = 2
    before = replicas_stored()
    assert store.put(k("two"), b"twice", cfg) == OK
    assert replicas_stored() == before + 2  # one copy on each node
    assert store.put(k("one"), b"once") == OK
    assert replicas_stored() == before + 3
    cfg.replica_num = 3  # two nodes only
    assert store.put(k("three"), b"x", cfg) < 0
    for attr, value in [("nof_replica_num", 1), ("dfs_replica_num", 1),
                        ("preferred_nof_segments", ["127.0.0.1:1"])]:
        bad = ReplicateConfig()
        setattr(bad, attr, value)
        assert store.put(k("bad"), b"x", bad) == NOT_SUPPORTED
        assert store.batch_put_from([k("bad")], [1], [1], bad) == [NOT_SUPPORTED]


@pytest.mark.parametrize("protocol", ["tcp", "auto"])  # auto: same-host nodes over shared memory
def test_zero_copy_through_registered_ctypes_buffers(new_store, buffers, protocol):
    store = new_store(protocol=protocol)
    data = os.urandom(64 * KIB)
    src = buffers.make(len(data), data)
    dst = buffers.make(len(data))
    src_ptr, dst_ptr = buffers.ptr(src), buffers.ptr(dst)
    key = k("zc")
    # unregistered memory is refused, never read or written
    assert store.put_from(key, src_ptr, len(data)) == INVALID
    assert store.get_into(key, dst_ptr, len(data)) == INVALID
    assert store.register_buffer(src_ptr, len(data)) == OK
    assert store.register_buffer(dst_ptr, len(data)) == OK
    assert store.register_buffer(src_ptr + 8, 16) == OK  # overlapping: the union counts
    assert store.register_buffer(src_ptr, 16) == INVALID  # the same start, another size
    assert store.unregister_buffer(src_ptr + 8) == OK
    assert store.put_from(key, src_ptr, len(data)) == OK
    assert store.get_into(key, dst_ptr, len(data)) == len(data)
    assert bytes(dst) == data
    # a buffer smaller than the object: INVALID_PARAMS before any byte lands (as Mooncake)
    ctypes.memset(dst, 0, len(data))
    assert store.get_into(key, dst_ptr, len(data) - 1) == INVALID
    assert bytes(dst) == bytes(len(data))
    assert store.get_into(key, dst_ptr, len(data) + 1) == INVALID  # past the registration
    assert store.get_into(k("none"), dst_ptr, 16) == NOT_FOUND
    # upsert_from replaces; a range inside a registered buffer works at an offset
    assert store.upsert_from(key, src_ptr + 1024, 1024) == OK
    assert store.get_into(key, dst_ptr + 10, 2048) == 1024
    assert bytes(dst)[10:1034] == data[1024:2048]

    keys = [k(f"zb{i}") for i in range(8)]
    piece = len(data) // 8
    assert store.batch_put_from(keys, [src_ptr + i * piece for i in range(8)], [piece] * 8) == [OK] * 8
    ctypes.memset(dst, 0, len(data))
    got = store.batch_get_into(keys + [k("none")], [dst_ptr + i * piece for i in range(8)] + [dst_ptr],
                               [piece] * 8 + [piece])
    assert got == [piece] * 8 + [NOT_FOUND]
    assert bytes(dst) == data
    # one undersized buffer fails that key only
    got = store.batch_get_into(keys[:2], [dst_ptr, dst_ptr + piece], [piece, piece - 1])
    assert got == [piece, INVALID]
    assert store.batch_upsert_from(keys[:2], [src_ptr, src_ptr], [10, 20]) == [OK, OK]
    assert store.get_size(keys[1]) == 20
    assert store.batch_put_from(keys[:2], [src_ptr], [1, 2]) == [INVALID, INVALID]
    # one bad key in a batch fails alone
    fine = k("fine")
    assert store.batch_put_from([fine, ""], [src_ptr, src_ptr], [8, 8]) == [OK, INVALID]
    assert store.get(fine) == data[:8]
    assert store.unregister_buffer(src_ptr) == OK and store.unregister_buffer(src_ptr) == INVALID
    assert store.put_from(k("after"), src_ptr, 16) == INVALID


def test_multi_buffer_scatter_gather(new_store, buffers):
    store = new_store()
    # an engine's host pool: K and V pages in separate regions, one object per page pair
    pool = buffers.make(64 * KIB, os.urandom(64 * KIB))
    out = buffers.make(64 * KIB)
    base, out_base = buffers.ptr(pool), buffers.ptr(out)
    assert store.register_buffer(base, 64 * KIB) == OK
    assert store.register_buffer(out_base, 64 * KIB) == OK
    keys = [k(f"mb{i}") for i in range(4)]
    ptrs = [[base + i * 4 * KIB, base + 32 * KIB + i * 4 * KIB, base + 16 * KIB + i * KIB]
            for i in range(4)]
    sizes = [[4 * KIB, 4 * KIB, KIB]] * 4
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [OK] * 4
    pool_bytes = bytes(pool)
    for key, p, s in zip(keys, ptrs, sizes, strict=True):
        expected = b"".join(pool_bytes[q - base:q - base + n] for q, n in zip(p, s, strict=True))
        assert store.get(key) == expected  # gathered in order
    dst_ptrs = [[out_base + q - base for q in p] for p in ptrs]
    got = store.batch_get_into_multi_buffers(keys + [k("none")], dst_ptrs + [[out_base]],
                                             sizes + [[KIB]])
    assert got == [9 * KIB] * 4 + [NOT_FOUND]
    out_bytes = bytes(out)
    for p, s in zip(ptrs, sizes, strict=True):
        for q, n in zip(p, s, strict=True):
            assert out_bytes[q - base:q - base + n] == pool_bytes[q - base:q - base + n]
    # buffers larger in total than the object: it fills the leading ones (as Mooncake)
    ctypes.memset(out, 0, 64 * KIB)
    got = store.batch_get_into_multi_buffers(keys[:1], [[out_base, out_base + 8 * KIB]],
                                             [[8 * KIB, 8 * KIB]])
    assert got == [9 * KIB]
    assert bytes(out)[:9 * KIB] == store.get(keys[0]) and bytes(out)[9 * KIB:] == bytes(55 * KIB)
    # buffers too small in total for the object: refused; mismatched lists: refused
    assert store.batch_get_into_multi_buffers(keys[:1], [[out_base]], [[KIB]]) == [INVALID]
    assert store.batch_put_from_multi_buffers(keys[:1], [[base, base]], [[1]]) == [INVALID]
    assert store.batch_put_from_multi_buffers(keys[:1], [[base - 1]], [[4]]) == [INVALID]


def test_get_into_ranges(new_store, buffers):
    store = new_store()
    key1, key2 = k("r1"), k("r2")
    v1, v2 = bytes(range(40)), bytes(range(100, 140))
    assert store.put(key1, v1) == OK and store.put(key2, v2) == OK
    buf0, buf1 = buffers.make(32), buffers.make(32)
    p0, p1 = buffers.ptr(buf0), buffers.ptr(buf1)
    assert store.register_buffer(p0, 32) == OK and store.register_buffer(p1, 32) == OK
    results = store.get_into_ranges(
        [p0, p1], [[key1, key2], [key2, key1]],
        [[[0, 20], [8]], [[4], [16]]], [[[1, 30], [2]], [[0], [10]]], [[[4, 3], [5]], [[6], [4]]])
    assert results == [[[4, 3], [5]], [[6], [4]]]
    b0, b1 = bytes(buf0), bytes(buf1)
    assert b0[0:4] == v1[1:5] and b0[20:23] == v1[30:33] and b0[8:13] == v2[2:7]
    assert b1[4:10] == v2[0:6] and b1[16:20] == v1[10:14]
    before = bytes(buf0)
    # source overflow, destination overflow, a missing key, an unregistered buffer
    results = store.get_into_ranges(
        [p0, p0], [[key1, k("none")], [key2]], [[[0, 30], [0]], [[0]]],
        [[[38, 0], [0]], [[0]]], [[[4, 4], [4]], [[8]]])
    assert results == [[[INVALID, INVALID], [NOT_FOUND]], [[8]]]
    assert bytes(buf0)[8:] == before[8:] and bytes(buf0)[:8] == v2[:8]
    unreg = buffers.make(8)
    assert store.get_into_ranges([buffers.ptr(unreg)], [[key1]], [[[0]]], [[[0]]], [[[4]]]) == [[[INVALID]]]
    assert bytes(unreg) == bytes(8)
    # shapes that do not agree: every fragment refused
    assert store.get_into_ranges([p0], [[key1], [key2]], [[[0]]], [[[0]]], [[[1]]]) == [[[INVALID]]]


def test_get_into_ranges_destination_is_one_registration_even_beside_another(new_store, buffers):
    """Two registrations side by side: a fragment that runs past the first buffer's end is a
    destination overflow, although the SDK counts the adjacent registration's memory too."""
    store = new_store()
    key = k("adj")
    value = bytes(range(64))
    assert store.put(key, value) == OK
    both = buffers.make(64)
    p0 = buffers.ptr(both)
    assert store.register_buffer(p0, 32) == OK and store.register_buffer(p0 + 32, 32) == OK
    results = store.get_into_ranges([p0, p0 + 32], [[key], [key]], [[[30, 0]], [[28]]],
                                    [[[0, 0]], [[0]]], [[[4, 2]], [[4]]])
    assert results == [[[INVALID, 2]], [[4]]]
    assert bytes(both)[:2] == value[:2] and bytes(both)[30:32] == bytes(2)
    assert bytes(both)[60:64] == value[:4]


def test_get_buffer(new_store):
    store = new_store()
    key = k("buf")
    value = os.urandom(3000)
    assert store.put(key, value) == OK
    handle = store.get_buffer(key)
    assert handle is not None and handle.size() == len(handle) == 3000
    assert ctypes.string_at(handle.ptr(), 3000) == value and bytes(memoryview(handle)) == value
    assert store.get_buffer(k("none")) is None
    got = store.batch_get_buffer([key, k("none")])
    assert bytes(got[0]) == value and got[1] is None


def test_removal(new_store, mc_cluster, monkeypatch):
    store = new_store()
    tag = uuid.uuid4().hex[:6]
    keys = [f"rx{tag}/a/{i}" for i in range(3)] + [f"rx{tag}/b/{i}" for i in range(2)]
    assert store.put_batch(keys, [b"v"] * 5) == OK
    assert store.remove_by_regex(f"^rx{tag}/a/.*") == 3
    assert store.batch_is_exist(keys) == [0, 0, 0, 1, 1]
    assert store.remove_by_regex(f"^rx{tag}/b/1$") == 1
    assert store.remove_by_regex("^(unclosed") == INVALID
    assert store.is_exist(keys[3]) == 1  # nothing removed by the refusal
    # patterns no prefix serves: the tenant's keys listed page by page, the matches removed
    searched = [f"rx{tag}/c/{i}" for i in range(6)]
    assert store.put_batch(searched, [b"v"] * 6) == OK
    assert store.remove_by_regex(f"{tag}/c/[0-3]$") == 4  # an unanchored search
    assert store.remove_by_regex(f"^(nothing|rx{tag}/c/5)$") == 1  # an alternation
    assert store.batch_is_exist(searched) == [0, 0, 0, 0, 1, 0]
    assert store.is_exist(keys[3]) == 1  # what no pattern matched stays

    other = MooncakeDistributedStore()  # another tenant: removal must not reach it
    monkeypatch.setenv("CELLAR_TOKEN", mc_cluster.token_for(OTHER_TENANT))  # its credential
    assert other.setup(*setup_args(mc_cluster), tenant_id=OTHER_TENANT) == OK
    monkeypatch.delenv("CELLAR_TOKEN")
    kept = k("kept")
    assert other.put(kept, b"v") == OK
    assert store.remove_by_regex(re.escape(kept)) == 0  # its listing is of its own tenant
    assert store.remove_all() >= 2  # keys[3] and keys[4] at least (other tests share the tenant)
    assert store.batch_is_exist(keys) == [0] * len(keys)
    assert store.remove_all() == 0
    assert other.get(kept) == b"v"  # the other tenant's key survives
    assert other.remove_by_regex(".*") == 1 and other.get(kept) == b""
    other.close()


def test_tensors(new_store):
    torch = pytest.importorskip("torch")
    store = new_store()
    t = torch.arange(12, dtype=torch.float16).reshape(3, 4)
    key = k("t")
    assert store.put_tensor(key, t) == OK
    back = store.get_tensor(key)
    assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)
    keys = [k("t0"), k("t1")]
    assert store.batch_put_tensor(keys, [t, t * 2]) == [OK, OK]
    got = store.batch_get_tensor(keys + [k("none")])
    assert torch.equal(got[1], t * 2) and got[2] is None
    assert store.put_tensor(key, t * 3) == OK and torch.equal(store.get_tensor(key), t)  # kept
    assert store.upsert_tensor(key, t * 3) == OK and torch.equal(store.get_tensor(key), t * 3)
    assert store.batch_upsert_tensor(keys, [t, t]) == [OK, OK]
    assert torch.equal(store.batch_get_tensor(keys)[1], t)
    raw = k("raw")
    assert store.put(raw, b"not a tensor") == OK
    assert store.get_tensor(raw) is None and store.batch_get_tensor([raw, key])[1] is not None
    assert store.put_tensor(k("nc"), t.t()) == INVALID  # not contiguous


def test_methods_when_master_is_gone(make_cluster):
    cluster = make_cluster(nodes=1, segment_size=64 << 20)
    store = MooncakeDistributedStore()
    store.client_timeout_s = 2.0
    assert store.setup(*setup_args(cluster)) == OK
    key = k("gone")
    assert store.put(key, b"v") == OK
    cluster.kill_master()
    assert store.health_check() == 2
    rpc = {int(ErrorCode.RPC_FAIL), int(ErrorCode.RPC_TIMEOUT)}
    assert store.put(k("after"), b"v") in rpc
    assert store.is_exist(key) in rpc and store.get_size(key) in rpc
    assert store.get(key) == b"" and store.get_batch([key]) == [b""]
    assert store.close() == 0
