"""Transfers in flight (storage_node/inflight.py): a seal waits for the allocation's other
writes, a newer allocation waits for an older one's transfers, a freed one drains first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cellar.storage_node.index import AllocState, ObjectIndex, ReadRefused, WriteRefused

SEG = 3


def admit(index: ObjectIndex, alloc: int, offset: int = 0, size: int = 100, *,
          hold: bool = True) -> None:
    index.admit_write(alloc_id=alloc, segment_id=SEG, object_offset=offset, object_size=size,
                      tenant="t", key=f"k{alloc}", checksum=1, epoch=1, grant_expiry_ms=10_000,
                      hold=hold)


def read(index: ObjectIndex, alloc: int, offset: int = 0, size: int = 100) -> None:
    index.admit_read(alloc_id=alloc, segment_id=SEG, object_offset=offset, length=size,
                     grant_expiry_ms=10_000, hold=True)


def freed(alloc: int, offset: int = 0, length: int = 100) -> SimpleNamespace:
    return SimpleNamespace(segment_id=SEG, alloc_id=alloc, offset=offset, length=length)


def sealed_object(index: ObjectIndex, alloc: int, offset: int = 0) -> None:
    admit(index, alloc, offset)
    assert index.record_written(alloc, 0, 100, held=True) is not None
    index.release(alloc)


def test_a_seal_is_refused_while_another_write_of_the_allocation_is_in_flight() -> None:
    """Bug 2's first step: a stalled second write (C2) of the same allocation is admitted;
    C1's full payload must not seal the allocation while C2 can still land over it."""
    index = ObjectIndex()
    admit(index, 1)            # C2: header admitted, payload stalled
    admit(index, 1)            # C1: the whole payload
    with pytest.raises(WriteRefused) as exc:
        index.record_written(1, 0, 100, held=True)
    assert exc.value.reason == WriteRefused.BUSY
    index.release(1)           # C1 refused and released
    entry = index.get(1)
    assert entry is not None and entry.state is AllocState.WRITING and entry.received_bytes == 0
    # a chunk that does not complete the allocation is recorded meanwhile
    admit(index, 1, size=100)
    assert index.record_written(1, 0, 50, held=True) is None
    index.release(1)
    # C2 is the last write in flight: it seals (its own allocation, its own bytes)
    assert index.record_written(1, 0, 100, held=True) is not None
    index.release(1)
    assert index.in_flight(1) == 0


def test_a_newer_allocation_is_refused_over_an_older_one_in_flight() -> None:
    index = ObjectIndex()
    sealed_object(index, 1)
    read(index, 1)             # a reply of allocation 1 is still being sent
    for attempt in (lambda: admit(index, 2, offset=50),
                    lambda: index.claim(alloc_id=2, segment_id=SEG, object_offset=50,
                                        object_size=100, grant_expiry_ms=10_000)):
        with pytest.raises(WriteRefused) as exc:
            attempt()
        assert exc.value.reason == WriteRefused.BUSY
    assert index.get(1) is not None and index.get(2) is None  # nothing dropped, nothing added
    index.release(1)
    admit(index, 2, offset=50)  # the reply left: the newer allocation takes the range
    assert index.get(1) is None and index.is_tombstoned(1)


def test_a_freed_entry_in_flight_keeps_its_range_blocked_until_released() -> None:
    """Bug 1: the master frees O (its notice reaches the node) while O's reply is still
    corked; another tenant's allocation over the range must wait until the reply left."""
    index = ObjectIndex()
    sealed_object(index, 1)
    read(index, 1)
    assert index.apply_freed([freed(1)], now_ms=0) == 1
    assert index.get(1) is None and index.draining() == 1
    with pytest.raises(WriteRefused) as exc:
        admit(index, 2, offset=50, size=10)
    assert exc.value.reason == WriteRefused.BUSY
    admit(index, 3, offset=100, size=10)  # next to it: not blocked
    index.release(3)
    index.release(1)
    assert index.draining() == 0
    admit(index, 2, offset=50, size=10)
    index.release(2)


def test_clear_and_a_tier_move_respect_transfers_in_flight() -> None:
    index = ObjectIndex()
    admit(index, 1)            # a write in flight when the node remounts
    index.clear(now_ms=0)
    assert index.draining() == 1
    source = SimpleNamespace(length=100, tenant="t", key="k", checksum=1, epoch=1,
                             write_grant_expiry_ms=10_000, engine_hash=b"", value_id=0,
                             alloc_id=1, soft_pin_until_ms=0)
    assert not index.seal_copy(source, 5, SEG, 0)  # type: ignore[arg-type]
    index.release(1)
    assert index.seal_copy(source, 5, SEG, 0)  # type: ignore[arg-type]


def test_every_hold_is_released_once() -> None:
    index = ObjectIndex()
    admit(index, 1)
    index.hold(1)              # a retried chunk drained while sealed
    assert index.in_flight(1) == 2
    index.release(1)
    index.release(1)
    assert index.in_flight(1) == 0
    with pytest.raises(KeyError):
        index.release(1)       # a release without its hold is a bug, never silent
    # holds are off by default (callers that move no bytes: claims, tests of the sealing rule)
    admit(index, 2, offset=200, hold=False)
    assert index.in_flight(2) == 0


def test_busy_is_a_retryable_refusal_for_the_sdk() -> None:
    """ST_BUSY makes the put revoke and retry on a new allocation (client/puts.py: any write
    status but NODE_TROUBLE), never marks the node failed, and proves the grant was authentic."""
    from cellar.client.checks import NODE_TROUBLE
    from cellar.storage_node.access import REFUSED_STATUS
    from cellar.transfer.frame import ST_BUSY, STATUS_NAMES
    from cellar.transfer.tcp_admission import AUTHENTIC_REFUSALS

    assert REFUSED_STATUS[WriteRefused.BUSY] == ST_BUSY
    assert ST_BUSY not in NODE_TROUBLE and ST_BUSY in AUTHENTIC_REFUSALS
    assert STATUS_NAMES[ST_BUSY] == "range busy"


def test_a_tier_move_never_writes_over_a_range_whose_reads_are_in_flight() -> None:
    """The mover's last look before its pwrite (`move_target_free`): a range whose older
    object is still being read out (or was freed while read) is not this move's yet."""
    index = ObjectIndex()
    sealed_object(index, 1)
    read(index, 1)                                    # a reply still leaving from the range
    assert not index.move_target_free(5, SEG, 0, 100)
    index.apply_freed([freed(1)], 0)                  # freed meanwhile: the range drains
    assert not index.move_target_free(5, SEG, 0, 100)
    assert index.move_target_free(5, SEG, 200, 100)   # elsewhere is free
    index.release(1)                                  # the reply left
    assert index.move_target_free(5, SEG, 0, 100)


def test_a_tier_move_takes_its_range_from_the_older_objects_before_it_copies() -> None:
    """Between the mover's last look and its copy, no read of an older object in the target
    range (freed by the master, its notice not here yet) is admitted: it would send the moved
    object's bytes under the older object's grant."""
    index = ObjectIndex()
    sealed_object(index, 1)
    sealed_object(index, 2, offset=100)
    assert index.move_target_free(5, SEG, 50, 100)    # over the end of 1 and the start of 2
    for alloc, offset in ((1, 0), (2, 100)):
        with pytest.raises(ReadRefused, match="not held here"):
            read(index, alloc, offset)
    sealed_object(index, 3, offset=300)               # outside the move's range: still read
    read(index, 3, offset=300)
    index.release(3)


def test_transfers_of_an_earlier_mount_keep_their_ranges_blocked_across_a_remount() -> None:
    """A remount (prepare_report for a rebuilding master, clear for one that expired this
    node) drops entries the new master will not know of; a write or read of them still in
    flight keeps its range from a newer allocation's claim (the master has shm writers claim
    on such a node: master/node_rpcs.py) until it ends."""
    for remount in ("prepare_report", "clear"):
        index = ObjectIndex()
        admit(index, 1)                                 # a write still streaming
        sealed_object(index, 2, offset=200)
        read(index, 2, offset=200)                      # a reply still leaving
        getattr(index, remount)(0)
        for alloc, offset in ((3, 50), (4, 250)):
            with pytest.raises(WriteRefused) as exc:
                index.claim(alloc_id=alloc, segment_id=SEG, object_offset=offset,
                            object_size=100, grant_expiry_ms=10_000)
            assert exc.value.reason == WriteRefused.BUSY, remount
        index.release(1)
        index.release(2)
        index.claim(alloc_id=3, segment_id=SEG, object_offset=50, object_size=100,
                    grant_expiry_ms=10_000)
        index.claim(alloc_id=4, segment_id=SEG, object_offset=250, object_size=100,
                    grant_expiry_ms=10_000)
