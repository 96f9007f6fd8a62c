"""Early reads against a real cluster (client/early_reads.py), both faces, tcp and shm.

- A key read once is read early the next time (the client's count of kept early reads
  grows) and every value comes back byte-exact.
- A key another client replaced meanwhile: the early read is discarded and the new value
  returned, never the old one.
- A key removed, its range then holding another tenant's object: a `get_many_into` of it is
  MISS and the caller's buffer holds none of that tenant's bytes (over shm the early copy
  does read the range's new bytes; they are cleared, `GetBatch._scrub`).
- A key this client put over shm is read early by its first get (the put's write grant
  covers the range of the client's own mapping); over tcp a put remembers nothing, since a
  node serves reads only under read grants. The removed-and-reused case holds for it too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

import cellar
from cellar.client.early_reads import Locations
from cellar.devtools.local_cluster import LocalCluster
from tests.support.faces import client_locations

SIZE = 64 << 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # read_trust_s 0: a get always asks, so a key read again is read early (not trusted)
    with LocalCluster(1, "64MiB", master_flags={"allow_unknown_tenants": "true",
                                                "read_trust_s": 0}) as c:
        yield c


def locations(client: Any) -> Locations:
    found: Locations = client_locations(client)
    return found


def test_a_key_read_again_is_read_early_and_exact(tenant_client: Any) -> None:
    client = tenant_client("early-a")
    values = {f"k{i}": os.urandom(SIZE) for i in range(4)}
    assert client.put_many(list(values.items())) == [cellar.Status.OK] * 4
    assert client.get_many(list(values)) == list(values.values())  # learns where they are
    seen = locations(client)
    before = seen.kept
    for _ in range(3):
        for key, value in values.items():
            assert client.get(key) == value
    assert client.get_many(list(values)) == list(values.values())
    assert seen.kept - before == 3 * 4 + 4
    client.remove_prefix("k")


def test_a_replaced_value_is_never_returned_from_its_old_allocation(tenant_client: Any) -> None:
    reader, writer = tenant_client("early-b"), tenant_client("early-b")
    old, new = os.urandom(SIZE), os.urandom(SIZE)
    writer.put("r", old)
    assert reader.get("r") == old
    writer.remove("r")
    writer.put("r", new)
    seen = locations(reader)
    discarded = seen.discarded
    assert reader.get("r") == new
    assert seen.discarded == discarded + 1
    assert reader.get("r") == new  # and the new place is read early from then on
    writer.remove("r")


def test_a_removed_keys_reused_range_leaves_no_foreign_bytes_in_the_buffer(
        tenant_client: Any) -> None:
    mine, theirs = tenant_client("early-mine"), tenant_client("early-theirs")
    mine.put("k", b"m" * SIZE)
    assert mine.get("k") == b"m" * SIZE
    _reused_range_leaves_no_foreign_bytes(mine, tenant_client("early-mine"), theirs,
                                          theirs_read=True)


def _reused_range_leaves_no_foreign_bytes(mine: Any, remover: Any, theirs: Any, *,
                                          theirs_read: bool) -> None:
    """`mine` knows where its "k" is; `remover` (another client of its tenant: `mine` would
    forget the place of a key it removed itself) removes it, `theirs` (another tenant) puts
    objects until one takes that range (read back when `theirs_read`, so that any face learns
    where it is; else its put must have kept the place), and a `get_many_into` of "k" by
    `mine` is MISS with none of their bytes in the buffer: its early read ran and was
    discarded."""
    where = locations(mine).find("k", time.monotonic())
    assert where is not None, "the client kept where its key is"
    assert remover.remove("k")
    secret = b"S" * SIZE
    # The removed range is free once the master has its last pin back (the reader's unpin is
    # sent shortly after its get); put the other tenant's objects until one lands there.
    try:
        landed = None
        deadline = time.monotonic() + 20.0
        n = 0
        while landed is None and time.monotonic() < deadline:
            key = f"s{n}"
            n += 1
            theirs.put(key, secret)
            if theirs_read:
                assert theirs.get(key) == secret
            spot = locations(theirs).find(key, time.monotonic())
            assert theirs_read or spot is not None
            if spot is not None and (spot.grant.segment_id, spot.grant.offset) == (
                    where.grant.segment_id, where.grant.offset):
                landed = key
            elif n % 8 == 0:
                time.sleep(0.2)
        assert landed is not None, "the other tenant's object never took the removed range"
        buffer = bytearray(b"\xee" * SIZE)
        discarded = locations(mine).discarded
        assert mine.get_many_into(["k"], [buffer]) == [cellar.MISS]
        assert locations(mine).discarded == discarded + 1, "the early read ran, was discarded"
        assert secret[:16] not in bytes(buffer)
        assert bytes(buffer) == bytes(SIZE)
    finally:
        theirs.remove_prefix("s")


def _over_shm(request: pytest.FixtureRequest) -> bool:
    return "shm" in request.node.callspec.id


def test_a_key_put_over_shm_is_read_early_by_its_first_get(
        tenant_client: Any, request: pytest.FixtureRequest) -> None:
    client = tenant_client("early-put")
    values = {f"p{i}": os.urandom(SIZE) for i in range(4)}
    seen = locations(client)
    before = seen.kept, seen.discarded
    assert client.put_many(list(values.items())) == [cellar.Status.OK] * 4
    known = [key for key in values if seen.find(key, time.monotonic()) is not None]
    assert client.get_many(list(values)) == list(values.values())
    if _over_shm(request):
        assert known == list(values)
        assert (seen.kept, seen.discarded) == (before[0] + 4, before[1])
    else:
        assert known == [], "a tcp put keeps no location: a node reads only under read grants"
        assert (seen.kept, seen.discarded) == before
    client.remove_prefix("p")


def test_a_put_keys_removed_range_reused_leaves_no_foreign_bytes_in_the_buffer(
        tenant_client: Any, request: pytest.FixtureRequest) -> None:
    if not _over_shm(request):
        pytest.skip("only a put over shm keeps a location")
    mine, theirs = tenant_client("early-put-mine"), tenant_client("early-put-theirs")
    mine.put("k", b"m" * SIZE)  # never read: the put kept where it wrote
    _reused_range_leaves_no_foreign_bytes(mine, tenant_client("early-put-mine"), theirs,
                                          theirs_read=False)


def test_a_key_this_client_changed_is_not_read_early_from_its_old_place(
        tenant_client: Any, request: pytest.FixtureRequest) -> None:
    # After its own acknowledged upsert or remove of a key, the place this client remembers
    # is another version's: an early read there would be discarded, a read wasted (before
    # 2026-12-05 every such get made one: a single 64 KiB get over tcp 405 -> 512 us)
    client = tenant_client("early-own")
    first, second = os.urandom(SIZE), os.urandom(SIZE)
    client.put("o", first)
    assert client.get("o") == first  # remembered from here on
    seen = locations(client)
    assert client.get("o") == first and seen.kept >= 1  # read early
    kept, discarded = seen.kept, seen.discarded
    client.upsert("o", second)
    assert client.get("o") == second
    # nothing wasted; over shm the upsert remembered its own new place, read early
    assert (seen.kept, seen.discarded) == (kept + _over_shm(request), discarded)
    assert client.remove("o")
    with pytest.raises(cellar.NotFound):
        client.get("o")
    assert seen.discarded == discarded
