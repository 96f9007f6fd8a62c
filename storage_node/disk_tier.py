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

Moves belong to a mount and expire (the late-write rule)
    A move is the master's promise that the target range is this copy's until the switch or
    until it abandons the move; it is never a promise from another master. So:
    - Each queued move carries the mount it arrived under. `begin_mount`, called before every
      mount (a new master, a restart, a re-mount after expiry) and before the index is
      reported, drops every queued move and waits for the one being written (bounded by
      MOUNT_GATE_TIMEOUT_S; past it the mount is retried), so no copy ordered by an earlier
      master lands in a range the new one already treats as free.
    - Each move carries the time its master waits for it (proto `Move.expires_in_ms`, counted
      from when the heartbeat was sent, so the node's deadline is never later than the
      master's). Past it, less MOVE_DEADLINE_MARGIN_S, the move is skipped and reported
      failed. The master reuses an abandoned target only after a further `tier_move_timeout_s`
      of quarantine (master/state/tiers.py `_abandon`), so a pwrite started before the
      deadline owns its range for a whole timeout more; the second check, before the seal,
      keeps a copy the master gave up on out of the index.
    - Right before the pwrite, under the mover's gate, the index must say the target is free
      for this move (`ObjectIndex.move_target_free`: not done, not freed, no newer allocation
      over it); the bytes of anything newer are never written over.
    - A move that raises is logged (at most once per ERROR_LOG_INTERVAL_S) and reported
      failed; the worker thread goes on with the next one. `stop` never waits longer than
      STOP_TIMEOUT_S.

Limits: at most MAX_QUEUED_MOVES moves wait (more are dropped, the master re-sends them), at
most MAX_DONE_PER_HEARTBEAT reports ride on one heartbeat, at most MAX_SEEN_MOVES re-send ids
remembered. It never talks to the master itself and never decides what moves (the master does).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from cellar.proto.tiers import MOVE_DEADLINE_MARGIN_S, TIER_DISK  # the margin: why, there
from cellar.storage_node.index import AllocState, ObjectIndex, WriteRefused
from cellar.storage_node.segment import Segment

log = logging.getLogger("cellar.node.disk")

DISK_SEGMENT_INDEX = 1000  # segment index of the disk tier (its id and file name derive from it)
MAX_QUEUED_MOVES = 4096
MAX_DONE_PER_HEARTBEAT = 4096
MAX_SEEN_MOVES = 4 * MAX_QUEUED_MOVES  # past it forgotten: an old re-send is refused by the index
# The deadline of a move from a master that sends none (expires_in_ms = 0, older than the
# field): the master's default tier_move_timeout_s, counted from receipt (not a bound then).
DEFAULT_MOVE_TIMEOUT_S = 30.0
MOUNT_GATE_TIMEOUT_S = 5.0  # a mount waits this long for the move being written, then retries
STOP_TIMEOUT_S = 10.0  # `stop` waits this long for the move being carried out
ERROR_LOG_INTERVAL_S = 10.0  # a failing move is logged at most once per this (with a count)


def open_disk_segment(disk_dir: str | os.PathLike[str], node_id: str, size_bytes: int) -> Segment:
    """Create (or re-attach, after a restart) the disk tier's file (SegmentError if not)."""
    segment = Segment.create(disk_dir, node_id, DISK_SEGMENT_INDEX, size_bytes, prefault=False)
    segment.tier = TIER_DISK
    return segment


@dataclass(frozen=True)
class QueuedMove:
    """A proto `Move` as queued: the mount it arrived under and its deadline (mover clock s)."""

    move: Any
    mount: int
    deadline_s: float


class TierMover:
    """Carries out the master's node-local moves on one worker thread (module docstring)."""

    def __init__(self, segments: Mapping[int, Segment], index: ObjectIndex, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._segments = segments
        self._index = index
        self.clock = clock  # monotonic seconds; the heartbeat's send time is read from it too
        self._queue: queue.Queue[QueuedMove | None] = queue.Queue(MAX_QUEUED_MOVES)
        self._lock = threading.Lock()  # guards _done, _seen, _mount
        # Held from a move's last checks through its pwrite, sync and seal, and by
        # `begin_mount`: a mount never starts while an earlier mount's move is writing.
        self._gate = threading.Lock()
        self._mount = 0  # bumped by `begin_mount`; a queued move of an earlier one is dropped
        self._stopping = threading.Event()
        self._done: list[tuple[int, int, bool]] = []  # (dst segment, dst alloc id, ok)
        self._seen: set[int] = set()  # dst alloc ids queued or carried out (re-sends ignored)
        self._thread: threading.Thread | None = None
        self._next_error_log_s = 0.0
        self._errors_unlogged = 0
        self.moved = 0
        self.moved_bytes = 0
        self.failed = 0    # reported ok=false, for any of the reasons below or a bad source
        self.expired = 0   # skipped or not sealed: past the deadline
        self.refused = 0   # the index says the target range is no longer this move's
        self.errors = 0    # raised (logged once per ERROR_LOG_INTERVAL_S)
        self.stale = 0     # dropped: queued under an earlier mount (reported to nobody)
        self.to_disk = 0
        self.from_disk = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cellar-tier-mover", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the worker: queued moves are dropped, the one running finishes (bounded)."""
        self._stopping.set()
        self._drain()
        try:
            self._queue.put_nowait(None)  # wakes a worker waiting on an empty queue
        except queue.Full:
            pass  # a submit refilled it: the worker sees `_stopping` after its current move
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("tier mover: a move still runs after %.0f s; not waiting",
                            STOP_TIMEOUT_S)
            self._thread = None

    def begin_mount(self, timeout_s: float = MOUNT_GATE_TIMEOUT_S) -> bool:
        """A mount is about to start: drop every queued move and forget the reports (the master
        about to be mounted never ordered them, or forgot them when it expired this node).
        False if the move being written did not finish within `timeout_s` (mount later)."""
        if not self._gate.acquire(timeout=timeout_s):
            return False
        try:
            with self._lock:
                self._mount += 1
                self._seen.clear()
                self._done.clear()
            self.stale += self._drain()
        finally:
            self._gate.release()
        return True

    def submit(self, moves: Sequence[Any], sent_s: float | None = None) -> None:
        """Queue the moves of a heartbeat reply; `sent_s` (mover clock) is when that heartbeat
        was sent, so each deadline (sent_s + the move's expires_in_ms) is never later than the
        master's. A re-sent move still queued or done is not queued again (its report, if lost
        with a failed heartbeat, is re-sent instead)."""
        received_s = self.clock()
        base_s = received_s if sent_s is None else min(sent_s, received_s)
        for move in moves:
            dst = int(move.dst_alloc_id)
            expires_in_ms = int(getattr(move, "expires_in_ms", 0))
            deadline_s = (base_s + expires_in_ms / 1000.0 if expires_in_ms
                          else received_s + DEFAULT_MOVE_TIMEOUT_S)
            with self._lock:
                if self._stopping.is_set():
                    return
                if dst in self._seen:
                    if self._index.get(dst) is not None:
                        self._done.append((int(move.dst_segment_id), dst, True))
                    continue
                item = QueuedMove(move, self._mount, deadline_s)
            try:
                self._queue.put_nowait(item)
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
                "expired": self.expired, "refused": self.refused, "errors": self.errors,
                "stale": self.stale, "to_disk": self.to_disk, "from_disk": self.from_disk,
                "queued": self._queue.qsize()}

    # ---- the worker --------------------------------------------------------------------

    def _run(self) -> None:
        while self.step():
            pass

    def step(self, timeout_s: float | None = None) -> bool:
        """Carry out the next queued move, waiting up to `timeout_s` (None: for ever) for one.
        False once stopped, or when none came in time (the worker thread's loop; tests call it
        directly). Never raises: a move that raises is reported failed."""
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return False
        if item is None or self._stopping.is_set():
            return False
        move = item.move
        try:
            with self._gate:
                if item.mount != self._mount:
                    self.stale += 1  # begin_mount drained the queue; this one raced it
                    return True
                ok = self.move_one(move, deadline_s=item.deadline_s)
        except Exception as exc:  # one bad move must not end the worker (module docstring)
            self.failed += 1
            self.errors += 1
            self._log_error(move, exc)
            ok = False
        with self._lock:
            if item.mount == self._mount:  # else: for a master that is gone
                self._done.append((int(move.dst_segment_id), int(move.dst_alloc_id), ok))
            if len(self._seen) > MAX_SEEN_MOVES:
                self._seen.clear()
        return True

    def move_one(self, move: Any, *, deadline_s: float = float("inf")) -> bool:
        """Copy, check, sync, seal one move; False (and nothing changed) if it cannot. The
        caller holds the gate (`step`), or nothing else runs (tests)."""
        src_seg = self._segments.get(int(move.src_segment_id))
        dst_seg = self._segments.get(int(move.dst_segment_id))
        length = int(move.length)
        src_offset, dst_offset = int(move.src_offset), int(move.dst_offset)
        dst_id = int(move.dst_alloc_id)
        source = self._index.get(int(move.src_alloc_id))
        if (src_seg is None or dst_seg is None or source is None
                or source.state is not AllocState.SEALED
                or (source.segment_id, source.offset, source.length)
                != (src_seg.segment_id, src_offset, length)
                or not dst_seg.contains(dst_offset, length) or length <= 0):
            self.failed += 1
            return False
        if self._past(deadline_s):
            return False
        # The last look before the pwrite: the master may have reused the range (a newer
        # allocation over it) or freed this move's allocation. Between this check and the
        # pwrite nothing can take the range: the master reuses a target only after the
        # deadline (checked just above, with its margin) and a quarantine of a whole timeout.
        if not self._index.move_target_free(dst_id, dst_seg.segment_id, dst_offset, length):
            self.refused += 1
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
        # Again before the seal: a copy the master has given up on must not enter the index
        # (its freed notice may have come already, and would not find it).
        if self._past(deadline_s):
            return False
        try:
            sealed = self._index.seal_copy(source, dst_id, dst_seg.segment_id, dst_offset)
        except WriteRefused as exc:  # a newer allocation overlaps it now
            log.warning("tier move to allocation %d: %s; not moved", dst_id, exc)
            sealed = False
        if not sealed:
            self.refused += 1
            self.failed += 1
            return False
        self.moved += 1
        self.moved_bytes += length
        if dst_seg.tier == TIER_DISK:
            self.to_disk += 1
        else:
            self.from_disk += 1
        return True

    def _past(self, deadline_s: float) -> bool:
        """Whether the master may be about to abandon the move (counted as expired)."""
        if self.clock() + MOVE_DEADLINE_MARGIN_S <= deadline_s:
            return False
        self.expired += 1
        self.failed += 1
        return True

    def _drain(self) -> int:
        """Take every queued move out; how many."""
        dropped = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return dropped
            dropped += item is not None

    def _log_error(self, move: Any, exc: Exception) -> None:
        now = self.clock()
        if now < self._next_error_log_s:
            self._errors_unlogged += 1
            return
        log.error("tier move to allocation %d failed (%d more failures since the last report): "
                  "%r", int(move.dst_alloc_id), self._errors_unlogged, exc, exc_info=exc)
        self._next_error_log_s = now + ERROR_LOG_INTERVAL_S
        self._errors_unlogged = 0
