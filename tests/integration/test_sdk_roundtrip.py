"""Round trips through the public SDK on a real 3-node cluster (master gRPC limit 4 MiB).

- 2,000 objects of random sizes 1 B - 8 MiB, replicas=2: every get returns the exact bytes,
  through get, get_many, get_into and get_many_into (numpy, bytearray, memoryview, alloc_buffer);
- batched calls answer in input order with per-key results;
- a 64 MiB object round-trips although the master's messages are limited to 4 MiB: payload
  never passes through the master.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import cellar
from cellar.errors import Status
from tests.support.faces import FACE_TRANSPORT_IDS, FACE_TRANSPORTS, open_face
from tests.support.pins import master_pin_count

NODES = 3
SEGMENT_BYTES = 320 << 20
MASTER_MESSAGE_LIMIT = "4MiB"
KIB, MIB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def cluster(module_cluster):
    return module_cluster(nodes=NODES, segment_size=SEGMENT_BYTES,
                          grpc_max_message_bytes=MASTER_MESSAGE_LIMIT, allow_unknown_tenants="true")


@pytest.fixture(params=FACE_TRANSPORTS, ids=FACE_TRANSPORT_IDS)
def client(request, cluster):
    """Each test runs over both faces (Client, AsyncClient) and both transports (tcp, shm),
    each in its own tenant (its own key namespace) on the module's cluster."""
    c = open_face(*request.param, cluster.address, timeout_s=30.0, tenant="-".join(request.param),
                  token=cluster.token_for("-".join(request.param), shm=True))
    yield c
    for prefix in ("rt/", "ord/", "big/", "pins/", "mt/"):  # room for the next face's run
        c.remove_prefix(prefix)
    c.close()


def payload(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def random_sizes(count: int, rng: np.random.Generator) -> list[int]:
    """Mostly small (log-uniform 1 B - 64 KiB), some medium, a tail of large up to 8 MiB."""
    n_large, n_medium = count // 50, count // 10
    small = np.exp(rng.uniform(0, np.log(64 * KIB), count - n_large - n_medium)).astype(int)
    medium = rng.integers(64 * KIB, MIB, n_medium)
    large = rng.integers(MIB, 8 * MIB, n_large)
    sizes = [int(max(1, s)) for s in np.concatenate([small, medium, large])]
    sizes[0], sizes[-1] = 1, 8 * MIB  # both ends of the range
    rng.shuffle(sizes)
    return sizes


def test_2000_random_objects_exact_bytes(client):
    rng = np.random.default_rng(2024)
    sizes = random_sizes(2000, rng)
    keys = [f"rt/{i:04d}" for i in range(len(sizes))]
    values = {k: payload(i, s) for i, (k, s) in enumerate(zip(keys, sizes, strict=True))}
    total = sum(sizes)
    assert 1 in sizes and 8 * MIB in sizes
    assert 2 * total < 0.8 * NODES * SEGMENT_BYTES, "test data must fit without eviction"

    # put: singles for the first 200, batches of 100 for the rest
    for k in keys[:200]:
        client.put(k, values[k], replicas=2)
    for start in range(200, len(keys), 100):
        chunk = keys[start:start + 100]
        statuses = client.put_many([(k, values[k]) for k in chunk], replicas=2)
        assert statuses == [Status.OK] * len(chunk)

    # get: singles for half, batches for the other half
    for k in keys[::2]:
        assert client.get(k) == values[k], k
    odd = keys[1::2]
    for start in range(0, len(odd), 128):
        chunk = odd[start:start + 128]
        got = client.get_many(chunk)
        assert len(got) == len(chunk)
        for k, v in zip(chunk, got, strict=True):
            assert v == values[k], k

    assert client.exists_many(keys) == [True] * len(keys)
    assert client.size(keys[0]) == sizes[0]

    # get_into every kind of destination, each with room to spare
    kinds = ["numpy", "numpy_f32", "bytearray", "memoryview", "alloc_buffer"]
    by_size = sorted(keys, key=lambda k: len(values[k]))
    sample = by_size[:10] + by_size[-10:] + [keys[i] for i in rng.choice(len(keys), 30, replace=False)]
    for i, k in enumerate(sample):
        size = len(values[k])
        kind = kinds[i % len(kinds)]
        if kind == "numpy":
            buf = np.full(size + 7, 0xAB, dtype=np.uint8)
        elif kind == "numpy_f32":
            buf = np.zeros((size + 7) // 4 + 1, dtype=np.float32)
        elif kind == "bytearray":
            buf = bytearray(b"\xab" * (size + 7))
        elif kind == "memoryview":
            buf = memoryview(bytearray(b"\xab" * (size + 7)))
        else:
            buf = cellar.alloc_buffer(size + 7)
        n = client.get_into(k, buf)
        assert n == size, (k, kind)
        raw = memoryview(buf).cast("B")
        assert raw[:size].tobytes() == values[k], (k, kind)
        if kind != "numpy_f32" and kind != "alloc_buffer":
            assert raw[size:].tobytes() == b"\xab" * 7, "bytes past the value are untouched"

    # get_many_into: mixed buffer kinds, a miss in the middle
    chunk = sample[:12] + ["rt/missing"] + sample[12:20]
    buffers = [cellar.alloc_buffer(max(1, len(values.get(k, b"x")))) if i % 2 else
               np.zeros(max(1, len(values.get(k, b"x"))), dtype=np.uint8)
               for i, k in enumerate(chunk)]
    sizes_read = client.get_many_into(chunk, buffers)
    for k, buf, n in zip(chunk, buffers, sizes_read, strict=True):
        if k == "rt/missing":
            assert n == -1
        else:
            assert n == len(values[k]) and memoryview(buf).cast("B")[:n].tobytes() == values[k]


def test_batches_answer_in_input_order(client):
    values = {f"ord/{i}": payload(10_000 + i, 100 + i) for i in range(20)}
    keys = list(values)
    # put_many over a mix of new and existing keys: ALREADY_EXISTS exactly where expected
    first = {k: values[k] for k in keys[::2]}
    assert client.put_many(first) == [Status.OK] * len(first)
    statuses = client.put_many([(k, values[k]) for k in keys], replicas=2)
    assert statuses == [Status.ALREADY_EXISTS if i % 2 == 0 else Status.OK for i in range(len(keys))]
    assert all(isinstance(s, Status) for s in statuses)

    probe = [keys[3], "ord/nope", keys[0], keys[3], "ord/nope2", keys[19]]
    got = client.get_many(probe)
    assert got == [values[keys[3]], None, values[keys[0]], values[keys[3]], None, values[keys[19]]]
    assert client.exists_many(probe) == [True, False, True, True, False, True]
    assert client.prefix_len(probe) == 1
    assert client.prefix_len(keys) == len(keys)
    assert client.prefix_len([]) == 0
    assert client.get_many([]) == [] and client.put_many([]) == []

    buffers = [bytearray(200) for _ in probe]
    assert client.get_many_into(probe, buffers) == [len(values[keys[3]]), -1, len(values[keys[0]]),
                                                    len(values[keys[3]]), -1, len(values[keys[19]])]
    assert bytes(buffers[2][:100]) == values[keys[0]]

    # upsert replaces; put of an existing key raises AlreadyExists
    with pytest.raises(cellar.AlreadyExists):
        client.put(keys[0], b"other")
    client.upsert(keys[0], b"replaced", replicas=2)
    assert client.get(keys[0]) == b"replaced"

    assert client.remove(keys[1]) is True
    assert client.remove(keys[1]) is False
    assert client.get_many(keys[:3]) == [b"replaced", None, values[keys[2]]]
    assert client.remove_prefix("ord/") == len(keys) - 1
    assert client.exists_many(keys) == [False] * len(keys)


def test_64mib_object_never_passes_through_the_master(client):
    status = client.status()
    assert status["max_object_bytes"] >= 64 * MIB
    big = payload(64, 64 * MIB)
    client.put("big/64MiB", big, replicas=2)
    assert client.get("big/64MiB") == big
    buf = cellar.alloc_buffer(64 * MIB)
    assert client.get_into("big/64MiB", buf) == 64 * MIB
    assert buf == big  # memoryview == bytes compares contents
    arr = np.frombuffer(big, dtype=np.uint8).copy()
    client.put("big/numpy", arr)
    assert client.get_many(["big/numpy"])[0] == big
    assert client.remove("big/64MiB") and client.remove("big/numpy")


def test_pins_are_released_soon_after_reads(cluster, client):
    client.upsert("pins/a", b"x" * 100)
    for _ in range(30):
        assert client.get("pins/a") == b"x" * 100
    assert client.get_many(["pins/a"] * 20) == [b"x" * 100] * 20
    assert client.get_into("pins/a", bytearray(100)) == 100
    assert client.size("pins/a") == 100
    # unpins ride on the next GetReplicas; the last ones go out within ~100 ms on their own
    deadline = time.monotonic() + 3
    while (pins := master_pin_count(cluster)) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pins == 0


def test_one_client_shared_by_threads(client):
    """A Client is thread-safe: concurrent puts and gets of distinct and shared keys."""
    shared = payload(77, 300 * KIB)
    client.upsert("mt/shared", shared, replicas=2)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            mine = {f"mt/{t}/{i}": payload(t * 1000 + i, 1 + (i * 7919) % (200 * KIB))
                    for i in range(40)}
            for k, v in list(mine.items())[:20]:
                client.put(k, v)
            assert client.put_many(list(mine.items())[20:], replicas=2) == [Status.OK] * 20
            for k, v in mine.items():
                assert client.get(k) == v
                assert client.get("mt/shared") == shared
            assert client.get_many(list(mine)) == list(mine.values())
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    assert client.remove_prefix("mt/") == 6 * 40 + 1


def test_batches_larger_than_the_masters_limit(make_cluster, connect_to):
    """Calls over `max_batch_keys` are split into several RPCs, results stay in input order,
    and the pin releases riding along respect the same limit."""
    small = make_cluster(nodes=1, segment_size="16MiB", max_batch_keys=16)
    client = connect_to(small)
    assert client.status()["max_batch_keys"] == 16
    values = {f"split/{i:03d}": payload(20_000 + i, 1 + i * 37) for i in range(100)}
    keys = list(values)
    assert client.put_many(values) == [Status.OK] * 100
    for _ in range(3):
        assert client.get_many(keys) == list(values.values())
    probe = keys[:50] + ["split/none"] + keys[50:]
    assert client.exists_many(probe) == [True] * 50 + [False] + [True] * 50
    assert client.prefix_len(keys) == 100 and client.prefix_len(probe) == 50
    sizes = client.get_many_into(probe, [bytearray(4000) for _ in probe])
    assert sizes == [len(values[k]) for k in keys[:50]] + [-1] + [len(values[k]) for k in keys[50:]]
    deadline = time.monotonic() + 3
    while (pins := master_pin_count(small)) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pins == 0
