"""The rdma transport on a real RDMA device: skipped unless `ibv_devices` lists one.

These machines have none (and cannot create one: no kernel support for rxe/siw), so here this
module skips with that reason; everything above the verbs calls is covered on a fake device in
tests/unit/test_rdma_transport.py. Where a device exists (and python3-pyverbs is installed):
1. the verbs layer alone: two queue pairs on the device connected to each other, one-sided
   WRITE then READ between registered buffers;
2. the full put/get suite of test_transports.py over `cellar.connect(..., transport="rdma")`
   against a real cluster whose nodes registered their segments and advertise rdma endpoints.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable

import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.transfer import verbs

DEVICES = verbs.list_devices()
pytestmark = pytest.mark.skipif(
    not DEVICES, reason="no RDMA device: `ibv_devices` lists none on this machine (the rdma "
    "transport is unit-tested on a fake verbs layer in tests/unit/test_rdma_transport.py)")

SIZES = [1, 4095, 65537, (1 << 20) + 3, 4 << 20, (9 << 20) + 1, 32 << 20]


def test_verbs_loopback_write_and_read() -> None:
    from cellar.transfer.shm import buffer_address

    dev = verbs.open_device(DEVICES[0])
    try:
        a, b = dev.create_qp(), dev.create_qp()
        a.connect(b.info)
        b.connect(a.info)
        src = memoryview(mmap.mmap(-1, 1 << 20))
        dst = memoryview(mmap.mmap(-1, 1 << 20))
        src[:] = os.urandom(1 << 20)
        local = dev.register(src, remote_write=False)
        remote = dev.register(dst, remote_write=True)
        a.post(1, verbs.OPCODE_WRITE, buffer_address(src), len(src), local.lkey,
               buffer_address(dst), remote.rkey)
        [done] = a.poll(1, 5.0)
        assert done.ok and done.wr_id == 1, done.status
        assert bytes(dst) == bytes(src)
        back = memoryview(mmap.mmap(-1, 1 << 20))
        back_mr = dev.register(back, remote_write=False)
        a.post(2, verbs.OPCODE_READ, buffer_address(back), len(back), back_mr.lkey,
               buffer_address(dst), remote.rkey)
        [done] = a.poll(1, 5.0)
        assert done.ok and bytes(back) == bytes(src)
        for obj in (local, remote, back_mr, a, b):
            obj.close()
    finally:
        dev.close()


def test_put_get_suite_over_rdma(make_cluster: Callable[..., LocalCluster],
                                 connect_to: Callable[..., cellar.Client]) -> None:
    cluster = make_cluster(nodes=2, segment_size="160MiB")
    client = connect_to(cluster, transport="rdma")
    segments = client.status()["segments"]
    assert all("rdma" in s["endpoints"] for s in segments), \
        "nodes did not advertise rdma endpoints (storage_node/rdma.attach not wired?)"
    values = {f"rdma/{n}": os.urandom(n) for n in SIZES}
    for key, value in values.items():
        client.put(key, value, replicas=2 if len(value) < (1 << 20) else 1)
    for key, value in values.items():
        assert client.get(key) == value
    outs = [cellar.alloc_buffer(len(v)) for v in values.values()]
    assert client.get_many_into(list(values), outs) == [len(v) for v in values.values()]
    for out, value in zip(outs, values.values(), strict=True):
        assert bytes(out[:len(value)]) == value
    items = [(f"rdma/batch/{i}", os.urandom(1 + i * 3001)) for i in range(32)]
    assert client.put_many(items) == [cellar.Status.OK] * len(items)
    asked = [k for k, _ in reversed(items)] + ["rdma/missing"]
    got = client.get_many(asked)
    assert got[-1] is None and got[:-1] == [v for _, v in reversed(items)]
    rdma = next(t for t in client._transports.transports if t.name == "rdma")
    assert rdma.stats["writes"] >= len(values) and rdma.stats["commits_refused"] == 0
