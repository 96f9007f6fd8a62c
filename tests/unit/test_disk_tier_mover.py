"""TierMover (storage_node/disk_tier.py): the late-write rule of node-local tier moves.

A move belongs to the mount it arrived under and expires when its master stops waiting for it;
it never writes over a range the index gives to a newer allocation; one move that raises does
not end the worker. Each test here failed on the mover before that rule (2026-12-06): queued
moves ran after a remount, past their deadline, over newer bytes, and one exception ended the
worker thread for good (and `stop` then hung on the full queue).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import xxhash

from cellar.proto import cellar_pb2 as pb
from cellar.storage_node import disk_tier
from cellar.storage_node.disk_tier import MOVE_DEADLINE_MARGIN_S, TierMover, open_disk_segment
from cellar.storage_node.heartbeat_cargo import HeartbeatCargo
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment

MIB = 1 << 20
DRAM_ID = 1
LENGTH = 64 << 10
NOW_MS = 1_800_000_000_000
TTL_MS = 30_000
TIMEOUT_MS = 30_000  # the master's default tier_move_timeout_s


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def put(index: ObjectIndex, segment: Segment, alloc_id: int, offset: int, data: bytes, *,
        seal: bool = True) -> None:
    """What a client's write does: admit, store the bytes, record them (SEALED if all)."""
    index.admit_write(alloc_id=alloc_id, segment_id=segment.segment_id, object_offset=offset,
                      object_size=len(data), tenant="default", key=f"k{alloc_id}",
                      checksum=xxhash.xxh3_64_intdigest(data), epoch=5,
                      grant_expiry_ms=NOW_MS + TTL_MS)
    written = len(data) if seal else len(data) // 2
    segment.store(offset, memoryview(data)[:written])
    index.record_written(alloc_id, 0, written)


def demotion(src_alloc: int, src_offset: int, disk: Segment, dst_alloc: int, dst_offset: int,
             expires_in_ms: int = TIMEOUT_MS) -> pb.Move:
    return pb.Move(src_segment_id=DRAM_ID, src_alloc_id=src_alloc, src_offset=src_offset,
                   length=LENGTH, dst_segment_id=disk.segment_id, dst_alloc_id=dst_alloc,
                   dst_offset=dst_offset, expires_in_ms=expires_in_ms)


@pytest.fixture
def node(tmp_path: Path):
    """A DRAM segment holding SEALED allocations 10 and 11, an empty disk tier, a mover."""
    dram = Segment.in_memory(DRAM_ID, MIB)
    disk = open_disk_segment(tmp_path, "n1", MIB)
    index = ObjectIndex()
    index.set_mount(NOW_MS - 1_000, TTL_MS)
    values = {10: bytes([0xA1]) * LENGTH, 11: bytes([0xB2]) * LENGTH}
    put(index, dram, 10, 0, values[10])
    put(index, dram, 11, LENGTH, values[11])
    clock = FakeClock()
    mover = TierMover({DRAM_ID: dram, disk.segment_id: disk}, index, clock=clock)
    yield dram, disk, index, mover, clock, values
    mover.stop()
    disk.close(unlink=True)


def run_queued(mover: TierMover) -> None:
    while mover.step(timeout_s=0):
        pass


def test_a_queued_move_runs_copies_and_seals(node) -> None:
    """The baseline the tests below depart from."""
    dram, disk, index, mover, clock, values = node
    mover.submit([demotion(10, 0, disk, 100, 0)])
    run_queued(mover)
    assert mover.take_done() == [(disk.segment_id, 100, True)]
    assert bytes(disk.view(0, LENGTH)) == values[10]
    assert index.sealed(100) is not None


def test_moves_queued_under_an_earlier_mount_are_dropped_on_remount(node) -> None:
    """Master A ordered two demotions; the node mounts master B (which never heard of them
    and treats their targets as free) before the mover reached them: neither runs, neither is
    reported to B; a move B orders afterwards runs."""
    dram, disk, index, mover, clock, values = node
    mover.submit([demotion(10, 0, disk, 100, 0), demotion(11, LENGTH, disk, 101, LENGTH)])
    assert mover.begin_mount()
    # B hands the first target range to a put, which the client writes and commits
    newer = bytes([0x5C]) * LENGTH
    put(index, disk, 500, 0, newer)
    run_queued(mover)
    assert mover.take_done() == []
    assert bytes(disk.view(0, LENGTH)) == newer
    assert bytes(disk.view(LENGTH, LENGTH)) == bytes(LENGTH)
    assert index.get(100) is None and index.get(101) is None
    assert mover.status()["stale"] == 2
    mover.submit([demotion(11, LENGTH, disk, 600, 2 * LENGTH)])
    run_queued(mover)
    assert mover.take_done() == [(disk.segment_id, 600, True)]


def test_a_move_that_raced_the_remount_is_dropped_when_it_reaches_the_worker(node) -> None:
    """A move submitted under mount 1 and taken by the worker after the remount (it raced
    `begin_mount`'s drain) is dropped at the gate, not written."""
    dram, disk, index, mover, clock, values = node
    mover.submit([demotion(10, 0, disk, 100, 0)])
    item = mover._queue.get_nowait()  # as if the worker had just taken it
    assert mover.begin_mount()
    mover._queue.put_nowait(item)
    run_queued(mover)
    assert mover.take_done() == [] and bytes(disk.view(0, LENGTH)) == bytes(LENGTH)


def test_a_move_past_its_deadline_is_skipped_and_reported_failed(node) -> None:
    """The master waits `expires_in_ms` from its reply, then abandons the move and reuses the
    range after a quarantine: a mover that far behind must not write it."""
    dram, disk, index, mover, clock, values = node
    mover.submit([demotion(10, 0, disk, 100, 0, expires_in_ms=5_000),
                  demotion(11, LENGTH, disk, 101, LENGTH, expires_in_ms=60_000)])
    clock.now_s += 5.0 - MOVE_DEADLINE_MARGIN_S / 2  # inside the margin: too late already
    run_queued(mover)
    assert mover.take_done() == [(disk.segment_id, 100, False), (disk.segment_id, 101, True)]
    assert bytes(disk.view(0, LENGTH)) == bytes(LENGTH)
    assert index.get(100) is None
    assert mover.status()["expired"] == 1


def test_the_deadline_counts_from_when_the_heartbeat_was_sent(node) -> None:
    """The reply's time left is counted from the request's send (the cargo's load), not from
    receipt: a reply that took 3 s leaves the node 3 s less, never more than the master."""
    dram, disk, index, mover, clock, values = node
    cargo = HeartbeatCargo(None, mover)
    load = cargo.load(pb.HeartbeatRequest())
    clock.now_s += 3.0
    cargo.unload(pb.HeartbeatReply(moves=[demotion(10, 0, disk, 100, 0, expires_in_ms=4_500)]),
                 load)
    clock.now_s += 0.6  # 3.6 s after the send: 0.9 s left, under the margin (from receipt: 3.9)
    run_queued(mover)
    assert mover.take_done() == [(disk.segment_id, 100, False)]
    assert bytes(disk.view(0, LENGTH)) == bytes(LENGTH)


def test_the_bytes_are_written_in_time_but_sealed_late_are_not_sealed(node, monkeypatch) -> None:
    """The deadline is checked again before the seal: a copy that finished writing after the
    master gave up on it stays out of the index (its freed notice may have come already)."""
    dram, disk, index, mover, clock, values = node
    sync = disk.sync

    def slow_sync(offset: int, length: int) -> None:
        sync(offset, length)
        clock.now_s += 10.0  # the msync of a slow disk

    monkeypatch.setattr(disk, "sync", slow_sync)
    mover.submit([demotion(10, 0, disk, 100, 0, expires_in_ms=5_000)])
    run_queued(mover)
    assert mover.take_done() == [(disk.segment_id, 100, False)]
    assert index.get(100) is None


@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "writing"])
def test_a_move_whose_target_holds_a_newer_allocation_does_not_write(node, seal) -> None:
    """The master abandoned move 100, and after the quarantine handed the range to put 500;
    the put's bytes (all of them, or the half received so far) must stay intact."""
    dram, disk, index, mover, clock, values = node
    newer = bytes([0x5C]) * LENGTH
    put(index, disk, 500, 0, newer, seal=seal)
    before = bytes(disk.view(0, LENGTH))
    mover.submit([demotion(10, 0, disk, 100, 0)])
    run_queued(mover)
    assert mover.take_done() == [(disk.segment_id, 100, False)]
    assert bytes(disk.view(0, LENGTH)) == before
    assert index.get(500) is not None and index.get(100) is None
    assert mover.status()["refused"] == 1


def test_a_move_whose_target_was_freed_does_not_write(node) -> None:
    """Move 100 sealed, then the master freed it (tombstone); a re-send that comes after the
    mover forgot it (its re-send memory is bounded) must not write the range again."""
    dram, disk, index, mover, clock, values = node
    mover.submit([demotion(10, 0, disk, 100, 0)])
    run_queued(mover)
    assert mover.take_done() == [(disk.segment_id, 100, True)]
    index.apply_freed([pb.FreedRange(segment_id=disk.segment_id, alloc_id=100, offset=0,
                                     length=LENGTH)], NOW_MS)
    marker = bytes([0x77]) * LENGTH
    disk.store(0, memoryview(marker))  # stands for whatever the range holds next
    mover.forget([100])
    mover.submit([demotion(10, 0, disk, 100, 0)])
    run_queued(mover)
    assert mover.take_done() == [(disk.segment_id, 100, False)]
    assert bytes(disk.view(0, LENGTH)) == marker


def test_an_exception_in_one_move_leaves_the_mover_running_the_next(node, monkeypatch) -> None:
    """The first move's write raises (a full disk, a freed target at the seal): it is reported
    failed and logged, the worker thread carries out the next one."""
    dram, disk, index, mover, clock, values = node
    store = disk.store
    calls = []

    def failing_once(offset: int, data: memoryview) -> None:
        calls.append(offset)
        if len(calls) == 1:
            raise RuntimeError("the device went away")
        store(offset, data)

    monkeypatch.setattr(disk, "store", failing_once)
    mover.start()
    mover.submit([demotion(10, 0, disk, 100, 0), demotion(11, LENGTH, disk, 101, LENGTH)])
    done: list[tuple[int, int, bool]] = []
    deadline = time.monotonic() + 10
    while len(done) < 2 and time.monotonic() < deadline:
        done += mover.take_done()
        time.sleep(0.01)
    assert done == [(disk.segment_id, 100, False), (disk.segment_id, 101, True)]
    assert mover._thread is not None and mover._thread.is_alive()
    assert mover.status()["errors"] == 1
    assert bytes(disk.view(LENGTH, LENGTH)) == values[11]


def test_stop_returns_with_a_full_queue_and_a_busy_worker(node, monkeypatch) -> None:
    """`stop` drops the queued moves and waits a bounded time for the one running."""
    dram, disk, index, mover, clock, values = node
    monkeypatch.setattr(disk_tier, "STOP_TIMEOUT_S", 0.2)
    release = threading.Event()
    store = disk.store

    def stuck(offset: int, data: memoryview) -> None:
        release.wait(10)
        store(offset, data)

    monkeypatch.setattr(disk, "store", stuck)
    mover.start()
    mover.submit([demotion(10, 0, disk, 100, 0)])
    while mover.status()["queued"]:
        time.sleep(0.01)  # the worker is inside the first move now
    mover.submit([demotion(11, LENGTH, disk, 1000 + i, LENGTH)
                  for i in range(disk_tier.MAX_QUEUED_MOVES)])
    assert mover.status()["queued"] == disk_tier.MAX_QUEUED_MOVES
    stopper = threading.Thread(target=mover.stop, daemon=True)
    started = time.monotonic()
    stopper.start()
    stopper.join(5)
    stopped = not stopper.is_alive()
    release.set()
    assert stopped, "stop() blocked on the full queue"
    assert time.monotonic() - started < 5
