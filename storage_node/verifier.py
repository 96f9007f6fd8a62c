"""Verifier: after a restart, check each restored object's bytes against its checksum.

A node restarted over its old segment files restores its index from the journal, but the
memory could have been changed while no process guarded it (a stray writer, a bad DIMM, a
test flipping bytes). The verifier hashes each restored SEALED entry (xxh3_64 of
segment[offset:offset+length], the checksum the writer declared) in a background thread, at
most `rate_bytes_per_s`, and drops every mismatch from the index. Dropped entries are queued
as "lost" ranges; the control loop hands them to the master with the next heartbeat, which
drops those replicas.

Objects are reported (and served) before they are verified: clients verify the checksum of
every read anyway and fall back to another replica, so an unverified corrupt replica can
cost a retry but never return wrong bytes. Verification only bounds how long it is listed.

It never writes segment memory and never talks to the network.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

import xxhash

from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment

log = logging.getLogger("cellar.node.verify")

CHUNK_BYTES = 4 << 20
MAX_LOST_PER_HEARTBEAT = 1000  # under the master's max_batch_keys default (1024)  # hashed per step, so the rate limit is smooth for large objects


class Verifier:
    def __init__(
        self, segments: Mapping[int, Segment], index: ObjectIndex, alloc_ids: list[int], *,
        rate_bytes_per_s: int,
    ) -> None:
        self._segments = dict(segments)
        self._index = index
        self._pending = list(alloc_ids)
        self._rate = max(int(rate_bytes_per_s), 1)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._lost: list[tuple[int, int, int, int]] = []  # (segment_id, alloc_id, offset, length)
        self._thread: threading.Thread | None = None
        self.total = len(alloc_ids)
        self.verified = 0
        self.corrupt = 0
        self.done = not alloc_ids

    def start(self) -> None:
        if self.done:
            return
        self._thread = threading.Thread(target=self._run, name="cellar-node-verify", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def take_lost(self, limit: int = MAX_LOST_PER_HEARTBEAT) -> list[tuple[int, int, int, int]]:
        with self._lock:
            lost, self._lost = self._lost[:limit], self._lost[limit:]
        return lost

    def requeue_lost(self, lost: list[tuple[int, int, int, int]]) -> None:
        with self._lock:
            self._lost[:0] = lost

    def status(self) -> dict[str, int | bool]:
        return {"total": self.total, "verified": self.verified, "corrupt": self.corrupt,
                "done": self.done}

    def _run(self) -> None:
        started = time.monotonic()
        hashed = 0
        for alloc_id in self._pending:
            if self._stop.is_set():
                return
            entry = self._index.get(alloc_id)
            segment = self._segments.get(entry.segment_id) if entry is not None else None
            if entry is None or segment is None:
                continue
            hasher = xxhash.xxh3_64()
            pos = entry.offset
            end = entry.offset + entry.length
            while pos < end:
                step = min(CHUNK_BYTES, end - pos)
                hasher.update(segment.memory[pos:pos + step])
                pos += step
                hashed += step
                ahead_s = hashed / self._rate - (time.monotonic() - started)
                if ahead_s > 0 and self._stop.wait(ahead_s):
                    return
            if hasher.intdigest() == entry.checksum:
                self.verified += 1
                continue
            if self._index.drop_if_matches(alloc_id, entry.segment_id, entry.offset, entry.length):
                self.corrupt += 1
                segment.dropped_objects += 1
                log.warning("object %r/%r (allocation %d, %d bytes at %d of segment %d) failed "
                            "its checksum after the restart: dropped", entry.tenant, entry.key,
                            alloc_id, entry.length, entry.offset, entry.segment_id)
                with self._lock:
                    self._lost.append((entry.segment_id, alloc_id, entry.offset, entry.length))
        self.done = True
        log.info("verified %d restored object(s) in %.2fs: %d intact, %d corrupt and dropped",
                 self.total, time.monotonic() - started, self.verified, self.corrupt)
