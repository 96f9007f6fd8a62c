"""The disk tier of a storage node: its file, and the node-local moves between tiers.

What it owns
    One file, `<disk_dir>/cellar-<node_id>-1000.seg`, `disk_size_bytes` long, mapped MAP_SHARED
    like a DRAM segment (storage_node/segment.py) but on a real disk and never pre-faulted. It is
    mounted on the master as one more segment with `tier = DISK`; the master keeps its own
    allocator, capacity and watermarks for it (master/state/tiers.py). Reads and writes of a
    disk replica go through the same grant checks, index and TCP data server as a DRAM one:
    the server sends from the mapping (sendmsg of a memoryview of page-cache pages), so a
    replica in the page cache leaves at memory speed and a cold one at the device's read speed.
    The file is offered over shm as a DRAM segment is (mount_report.py): a trusted same-host
    client copies into and out of its own mapping of it, at page-cache speed, bypassing TCP.

Why a mapped file and not O_DIRECT (measured in `make bench-disk`, docs/disk-tier.md)
    One data path for both tiers (grants, index, sealing, journal, verifier, TCP server), and
    the kernel's page cache is the read cache and the write-back queue, and same-host clients
    can map the file as they map a DRAM segment. O_DIRECT would bypass
    the cache, needs aligned buffers and its own I/O threads, and pays off only when the page
    cache competes with the DRAM tier for memory; the bench measures both against the device.

Moves (demotion DRAM -> disk, promotion disk -> DRAM)
    The master asks for them in heartbeat replies (`Move`) once it has allocated the target
    range under a new alloc id. `TierMover` carries them out on one worker thread: the source
    must still be the SEALED allocation the master named, at the named place; its bytes are
    copied into the target range, their xxh3_64 must equal the recorded checksum, a disk
    target is msync'ed, and only then the copy enters the index (journaled) as SEALED and the
    move is reported done (`MoveDone`) with the next heartbeat. The master switches the replica
    only on that report, so a reader always has a sealed replica: the old one until the new one
    is durable and recorded. A move that fails is reported with ok=false and changes nothing.

Limits: at most MAX_QUEUED_MOVES moves wait (more are dropped, the master re-sends them), at
most MAX_DONE_PER_HEARTBEAT reports ride on one heartbeat. It never talks to the master itself
and never decides what moves (the master does).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import xxhash

from cellar.proto.tiers import TIER_DISK
from cellar.storage_node.index import AllocState, ObjectIndex
from cellar.storage_node.segment import Segment

log = logging.getLogger("cellar.node.disk")

DISK_SEGMENT_INDEX = 1000  # segment index of the disk tier (its id and file name derive from it)
MAX_QUEUED_MOVES = 4096
MAX_DONE_PER_HEARTBEAT = 4096


def open_disk_segment(disk_dir: str | os.PathLike[str], node_id: str, size_bytes: int) -> Segment:
    """Create (or re-attach, after a restart) the disk tier's file (SegmentError if not)."""
    segment = Segment.create(disk_dir, node_id, DISK_SEGMENT_INDEX, size_bytes, prefault=False)
    segment.tier = TIER_DISK
    return segment


class TierMover:
    """Carries out the master's node-local moves on one worker thread (module docstring)."""

    def __init__(self, segments: Mapping[int, Segment], index: ObjectIndex) -> None:
        self._segments = segments
        self._index = index
        self._queue: queue.Queue[Any] = queue.Queue(MAX_QUEUED_MOVES)
        self._lock = threading.Lock()
        self._done: list[tuple[int, int, bool]] = []  # (dst segment, dst alloc id, ok)
        self._seen: set[int] = set()  # dst alloc ids queued or carried out (re-sends ignored)
        self._thread: threading.Thread | None = None
        self.moved = 0
        self.moved_bytes = 0
        self.failed = 0
        self.to_disk = 0
        self.from_disk = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cellar-tier-mover", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    def submit(self, moves: Sequence[Any]) -> None:
        """Queue the moves of a heartbeat reply; a re-sent move still queued or done is not
        queued again (its report, if lost with a failed heartbeat, is re-sent instead)."""
        for move in moves:
            dst = int(move.dst_alloc_id)
            with self._lock:
                if dst in self._seen:
                    if self._index.get(dst) is not None:
                        self._done.append((int(move.dst_segment_id), dst, True))
                    continue
            try:
                self._queue.put_nowait(move)
            except queue.Full:
                return  # the master sends them again
            with self._lock:
                self._seen.add(dst)

    def take_done(self, limit: int = MAX_DONE_PER_HEARTBEAT) -> list[tuple[int, int, bool]]:
        with self._lock:
            done, self._done = self._done[:limit], self._done[limit:]
            return done

    def requeue_done(self, done: list[tuple[int, int, bool]]) -> None:
        """The heartbeat carrying `done` failed: send them with the next one."""
        with self._lock:
            self._done[:0] = done

    def forget(self, dst_alloc_ids: Sequence[int]) -> None:
        with self._lock:
            self._seen.difference_update(dst_alloc_ids)

    def status(self) -> dict[str, int]:
        return {"moved": self.moved, "moved_bytes": self.moved_bytes, "failed": self.failed,
                "to_disk": self.to_disk, "from_disk": self.from_disk,
                "queued": self._queue.qsize()}

    def _run(self) -> None:
        while True:
            move = self._queue.get()
            if move is None:
                return
            ok = self.move_one(move)
            with self._lock:
                self._done.append((int(move.dst_segment_id), int(move.dst_alloc_id), ok))
                if len(self._seen) > 4 * MAX_QUEUED_MOVES:
                    self._seen.clear()  # bounded: an old re-send is refused by the index anyway

    def move_one(self, move: Any) -> bool:
        """Copy, check, sync, seal one move; False (and nothing changed) if it cannot."""
        src_seg = self._segments.get(int(move.src_segment_id))
        dst_seg = self._segments.get(int(move.dst_segment_id))
        length = int(move.length)
        src_offset, dst_offset = int(move.src_offset), int(move.dst_offset)
        source = self._index.get(int(move.src_alloc_id))
        if (src_seg is None or dst_seg is None or source is None
                or source.state is not AllocState.SEALED
                or (source.segment_id, source.offset, source.length)
                != (src_seg.segment_id, src_offset, length)
                or not dst_seg.contains(dst_offset, length) or length <= 0):
            self.failed += 1
            return False
        dst = dst_seg.view(dst_offset, length)
        try:
            dst_seg.store(dst_offset, src_seg.view(src_offset, length))  # a disk file: pwrite
        except OSError as exc:
            log.warning("tier move of allocation %d: %s; not moved", source.alloc_id, exc)
            self.failed += 1
            return False
        if xxhash.xxh3_64_intdigest(dst) != source.checksum:
            log.warning("tier move of allocation %d: the bytes do not match their checksum; "
                        "not moved", source.alloc_id)
            self.failed += 1
            return False
        if dst_seg.tier == TIER_DISK:
            dst_seg.sync(dst_offset, length)
        if not self._index.seal_copy(source, int(move.dst_alloc_id), dst_seg.segment_id,
                                     dst_offset):
            self.failed += 1
            return False
        self.moved += 1
        self.moved_bytes += length
        if dst_seg.tier == TIER_DISK:
            self.to_disk += 1
        else:
            self.from_disk += 1
        return True
