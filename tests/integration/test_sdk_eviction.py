"""Fill a cluster to 3x its capacity through the SDK.

Writers are never refused while something is evictable; the most recently written objects are
still there; every object that reads back has exactly the bytes that were written.
"""

from __future__ import annotations

import numpy as np
import pytest

from cellar.errors import Status
from tests.support.faces import FACES, connect_face

KIB, MIB = 1 << 10, 1 << 20
SEGMENT_BYTES = 32 * MIB
NODES = 2


@pytest.mark.parametrize("face", FACES)
def test_fill_to_three_times_capacity(make_cluster, face):
    cluster = make_cluster(nodes=NODES, segment_size=SEGMENT_BYTES)
    client = connect_face(face, cluster.address)
    try:
        _fill(client)
    finally:
        client.close()


def _fill(client):
    capacity = client.status()["capacity_bytes"]
    assert capacity == NODES * SEGMENT_BYTES

    rng = np.random.default_rng(7)
    keys: list[str] = []
    values: dict[str, bytes] = {}
    written = 0
    i = 0
    while written < 3 * capacity:
        # 256 KiB pages mostly, some odd sizes, written one by one and in batches of 16
        batch = {}
        for _ in range(16):
            size = 256 * KIB if i % 4 else int(rng.integers(1, 512 * KIB))
            key = f"fill/{i:05d}"
            batch[key] = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            written += size
            i += 1
        if (i // 16) % 2:
            for k, v in batch.items():
                client.put(k, v)  # raises (NoSpace, ...) if refused
        else:
            assert client.put_many(batch) == [Status.OK] * len(batch)
        keys += list(batch)
        values.update(batch)

    # the most recent objects (well under the low watermark's worth) are all there
    recent = keys[-32:]
    assert client.get_many(recent) == [values[k] for k in recent]
    for k in recent[-8:]:
        assert client.get(k) == values[k]

    # nothing read returns wrong bytes; old objects were evicted to make room
    present_bytes = 0
    for start in range(0, len(keys), 128):
        chunk = keys[start:start + 128]
        for k, got in zip(chunk, client.get_many(chunk), strict=True):
            if got is not None:
                assert got == values[k], k
                present_bytes += len(got)
    assert capacity // 2 <= present_bytes <= capacity
    assert client.get_many(keys[:16]).count(None) >= 8, "the oldest objects should be evicted"
    status = client.status()
    assert status["used_bytes"] <= capacity
