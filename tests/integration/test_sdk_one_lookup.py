"""A one-key get of a key this client knows nothing about, made in one step against a real
cluster (client/one_read.py: one GetReplicas, then one read of the first replica, without the
general get flow), on every face and transport:

- `get` (AsyncClient.get: a loop turn's lone get), `get_into` and `get_into_ptr` of keys
  another client put: the bytes are exact, no
  byte past the value's size is written, each get is one GetReplicas at the master and one
  lookup made in one step, and every pin those lookups took is released (the master's pin
  count falls back to where it was).
- A key that is not there raises NotFound after one GetReplicas; a buffer too small raises
  BufferTooSmall and leaves the buffer as it was; neither holds a pin.
- The next get of a key read this way is a trusted read (no GetReplicas): the one step left
  its place behind as the flow does.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from typing import Any

import pytest

import cellar
from cellar.client import one_read
from cellar.devtools.local_cluster import LocalCluster
from tests.support.faces import open_pair
from tests.support.http import master_metric

SIZE = 48 << 10 | 123  # not a multiple of any page, so a write past the value would show
KEYS = 8
SENTINEL = 0x5A


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "16MiB", master_flags={"allow_unknown_tenants": "true"}) as c:
        yield c


def get_replicas_calls(cluster: LocalCluster) -> float:
    return master_metric(cluster, "master_get_replica_list_requests_total")


def pins_fall_to(cluster: LocalCluster, count: float, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while master_metric(cluster, "master_pin_count") > count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each one-step lookup's reply planned (True: its read; False: the general flow)."""
    seen: list[bool] = []
    real = one_read.on_lookup

    def spy(*args: Any) -> bool:
        planned = real(*args)
        seen.append(planned)
        return planned

    monkeypatch.setattr(one_read, "on_lookup", spy)
    return seen


def value_of(i: int) -> bytes:
    return bytes((i * 31 + j) % 251 for j in range(SIZE))


@pytest.mark.parametrize("face", ["sync", "async"])
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_key_never_read_is_one_lookup_and_one_read(cluster: LocalCluster, face: str,
                                                     transport: str, lookups: list[bool]) -> None:
    writer, reader = open_pair(face, transport, cluster, f"one-lookup-{face}-{transport}")
    try:
        keys = [f"k/{i}" for i in range(3 * KEYS)]
        for i, key in enumerate(keys):
            writer.put(key, value_of(i))
        pins = master_metric(cluster, "master_pin_count")
        asked = get_replicas_calls(cluster)
        for i, key in enumerate(keys[:KEYS]):  # get_into: exact bytes, nothing past them
            buffer = bytearray([SENTINEL]) * (SIZE + 64)
            assert reader.get_into(key, buffer) == SIZE
            assert bytes(buffer[:SIZE]) == value_of(i)
            assert buffer[SIZE:] == bytearray([SENTINEL]) * 64
        for i, key in enumerate(keys[KEYS:2 * KEYS], KEYS):  # get: new bytes
            assert reader.get(key) == value_of(i)
        memory = ctypes.create_string_buffer(SIZE + 64)
        reader.register_buffer(ctypes.addressof(memory), SIZE + 64)
        for i, key in enumerate(keys[2 * KEYS:], 2 * KEYS):  # get_into_ptr: a raw address
            ctypes.memset(memory, SENTINEL, SIZE + 64)
            assert reader.get_into_ptr(key, ctypes.addressof(memory), SIZE + 64) == SIZE
            assert memory.raw[:SIZE] == value_of(i)
            assert memory.raw[SIZE:] == bytes([SENTINEL]) * 64
        one_step = len(keys)  # AsyncClient.get: each is its loop turn's lone get
        assert lookups == [True] * one_step, "each get was one lookup made in one step"
        assert get_replicas_calls(cluster) - asked == len(keys)
        assert pins_fall_to(cluster, pins), "every lookup's pin is released"
        asked = get_replicas_calls(cluster)
        assert reader.get(keys[0]) == value_of(0)  # its place was kept: a trusted read
        assert get_replicas_calls(cluster) == asked and len(lookups) == one_step
    finally:
        writer.close()
        reader.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_miss_and_a_buffer_too_small_are_raised_after_one_lookup_holding_no_pin(
        cluster: LocalCluster, face: str, lookups: list[bool]) -> None:
    writer, reader = open_pair(face, "tcp", cluster, f"one-lookup-errors-{face}")
    try:
        writer.put("there", value_of(1))
        pins = master_metric(cluster, "master_pin_count")
        asked = get_replicas_calls(cluster)
        with pytest.raises(cellar.NotFound):
            reader.get("not-there")
        buffer = bytearray([SENTINEL]) * (SIZE - 1)
        with pytest.raises(cellar.BufferTooSmall):
            reader.get_into("there", buffer)
        assert buffer == bytearray([SENTINEL]) * (SIZE - 1), "no byte landed"
        assert get_replicas_calls(cluster) - asked == 2 and lookups == []  # raised in on_lookup
        assert pins_fall_to(cluster, pins)
        assert reader.get_into("there", bytearray(SIZE)) == SIZE  # and then it fits
        assert lookups == [True]
    finally:
        writer.close()
        reader.close()
