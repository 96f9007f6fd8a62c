"""IndexJournal: the node's object index, persisted cheaply so that a kill -9 does not lose it.

What it owns
    One append-only file next to the segments (`<dir>/cellar-<node_id>.idx`, tmpfs like the
    segments, so it survives a process crash and dies with the machine, exactly like the bytes
    it describes). A record is written when an allocation becomes SEALED (everything a master
    rebuild needs: alloc id, segment, offset, length, tenant, key, checksum, epoch) and when a
    SEALED allocation is dropped (freed by the master, refused in a rebuild, failed
    verification). WRITING allocations are never journaled: a restarted node drops them.

Format (little endian)
    file   = MAGIC (8 bytes) record*
    record = body_len u32 | xxh32(body) u32 | body
    body   = 1 (u8) alloc_id segment_id offset length checksum epoch expiry_ms (7 x u64)
             tenant_len u16 key_len u16 tenant key          -- SEALED
           | 2 (u8) alloc_id (u64)                          -- DROPPED
           | 3 (u8) alloc_id (u64) hash_len (u8) hash       -- ENGINE HASH of a SEALED entry
           | 4 (u8) alloc_id (u64) value_id (u64)          -- VALUE ID of a SEALED copy
           | 5 (u8) alloc_id (u64) until_ms (u64)          -- SOFT PIN of a SEALED entry
    (3 came later: the master tells a node the engine's hash of a page after its PutEnd, so a
    rebuilt master knows it; a node from before it stops its replay at such a record. 4 too:
    a copy of a value (a tier move, a repair copy) gets an alloc id newer than the put that
    wrote the value; its value id is that put's, which is how a rebuilt master orders a key's
    values, proto ReportedObject.value_alloc_id. Only a copy has one. 5 as well: the master
    tells a node an object's soft pin and its lapse, wall clock ms, with a heartbeat reply, so
    a rebuilt master pins it again.)
    Replay reads records in order and stops at the first short or corrupt one (a torn tail),
    which is cut off. Records go out with write() on an O_APPEND descriptor: a process killed
    mid-call wrote a prefix of them, and replay keeps exactly the whole records of that
    prefix, so fsync is not needed (nor useful on tmpfs).

Deferred appends
    `sealed(..., defer=True)` and `dropped(..., defer=True)` queue the record instead of
    writing it; `flush()` writes every queued record with one write(). The storage node seals
    objects this way and its data server flushes before any reply leaves (so a write
    acknowledged OK is always journaled, as before): one syscall per batch of replies instead
    of one per sealed object. The index queues the drops of one call (a heartbeat's freed
    ranges) and flushes them before it returns: one syscall per call, not per object. An
    immediate append writes the queue first, then itself, so the file keeps the call order.

Compaction
    On open, after replay, the file is rewritten with only the live entries (temp file +
    rename). While running, `maybe_compact` rewrites it when dead records outnumber live ones
    (and are more than COMPACT_MIN_DEAD), so the file stays within about twice the live set.

Failure: if an append fails (a full tmpfs), the journal deletes its file and stops: a restart
then restores nothing, which loses cached objects but can never restore a stale entry.

Thread safety: none of its own; the index calls it with the index lock held.
It never reads segment memory and never decides what is intact (the verifier does).
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import xxhash

from cellar.proto.engine_hash import MAX_ENGINE_HASH_BYTES

log = logging.getLogger("cellar.node.journal")

MAGIC = b"CELLARJ1"
_HEAD = struct.Struct("<II")          # body_len, xxh32(body)
_SEALED = struct.Struct("<BQQQQQQQHH")
_DROPPED = struct.Struct("<BQ")
KIND_SEALED = 1
KIND_DROPPED = 2
KIND_ENGINE_HASH = 3
_ENGINE_HASH = struct.Struct("<BQB")
KIND_VALUE_ID = 4
KIND_SOFT_PIN = 5
_ID_PAIR = struct.Struct("<BQQ")      # kinds 4 and 5: kind, alloc_id, one u64
MAX_BODY_BYTES = 1 << 20              # a key is at most 64 KiB on any configured master
COMPACT_MIN_DEAD = 65536
MAX_QUEUED_RECORDS = 4096             # deferred records beyond this are written at once


@dataclass(slots=True)
class JournalEntry:
    alloc_id: int
    segment_id: int
    offset: int
    length: int
    checksum: int
    epoch: int
    write_grant_expiry_ms: int
    tenant: str
    key: str
    engine_hash: bytes = b""
    value_id: int = 0  # a copy's value: the alloc id of the put that wrote it (0: alloc_id)
    soft_pin_until_ms: int = 0  # the soft pin the master noted, wall clock ms (0: none)


def journal_path(directory: str | os.PathLike[str], node_id: str) -> Path:
    return Path(directory) / f"cellar-{node_id}.idx"


class SealedRecord(Protocol):
    """The fields a SEALED record holds: a JournalEntry, or the index's own entry (which has
    them under the same names, so sealing an object builds no JournalEntry first)."""

    @property
    def alloc_id(self) -> int: ...
    @property
    def segment_id(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def checksum(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def write_grant_expiry_ms(self) -> int: ...
    @property
    def tenant(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def engine_hash(self) -> bytes: ...
    @property
    def value_id(self) -> int: ...
    @property
    def soft_pin_until_ms(self) -> int: ...


def _encode_entry(e: SealedRecord) -> bytes:
    """The records of one live entry: SEALED, then its engine hash, value id and soft pin, if
    it has them (one write() carries all of them, so a replay never sees a copy without its
    value id)."""
    record = _encode_sealed(e)
    if e.engine_hash:
        record += _encode_engine_hash(e.alloc_id, e.engine_hash)
    if e.value_id:
        record += _encode_id_pair(KIND_VALUE_ID, e.alloc_id, e.value_id)
    if e.soft_pin_until_ms:
        record += _encode_id_pair(KIND_SOFT_PIN, e.alloc_id, e.soft_pin_until_ms)
    return record


def _encode_id_pair(kind: int, alloc_id: int, value: int) -> bytes:
    return _framed(_ID_PAIR.pack(kind, alloc_id, value))


def _framed(body: bytes) -> bytes:
    """One record: `body` behind its length and xxh32 (what replay checks)."""
    return _HEAD.pack(len(body), xxhash.xxh32_intdigest(body)) + body


def _encode_engine_hash(alloc_id: int, engine_hash: bytes) -> bytes:
    assert 0 < len(engine_hash) <= MAX_ENGINE_HASH_BYTES, "an engine hash is 1..33 bytes"
    body = _ENGINE_HASH.pack(KIND_ENGINE_HASH, alloc_id, len(engine_hash)) + engine_hash
    return _framed(body)


def _encode_sealed(e: SealedRecord) -> bytes:
    tenant = e.tenant.encode("utf-8", "surrogatepass")
    key = e.key.encode("utf-8", "surrogatepass")
    body = _SEALED.pack(KIND_SEALED, e.alloc_id, e.segment_id, e.offset, e.length,
                        e.checksum & 0xFFFFFFFFFFFFFFFF, e.epoch, max(e.write_grant_expiry_ms, 0),
                        len(tenant), len(key)) + tenant + key
    return _framed(body)


def _encode_dropped(alloc_id: int) -> bytes:
    body = _DROPPED.pack(KIND_DROPPED, alloc_id)
    return _framed(body)


def replay(data: bytes) -> tuple[dict[int, JournalEntry], int, int]:
    """(live entries by alloc id, bytes of valid prefix, records read) of a journal image."""
    live: dict[int, JournalEntry] = {}
    if not data.startswith(MAGIC):
        return live, 0, 0
    pos = len(MAGIC)
    records = 0
    end = len(data)
    while pos + _HEAD.size <= end:
        body_len, digest = _HEAD.unpack_from(data, pos)
        start = pos + _HEAD.size
        if body_len == 0 or body_len > MAX_BODY_BYTES or start + body_len > end:
            break
        body = data[start:start + body_len]
        if xxhash.xxh32_intdigest(body) != digest:
            break
        kind = body[0]
        if kind == KIND_SEALED and body_len >= _SEALED.size:
            (_, alloc_id, segment_id, offset, length, checksum, epoch, expiry, tlen,
             klen) = _SEALED.unpack_from(body, 0)
            if _SEALED.size + tlen + klen != body_len:
                break
            text = body[_SEALED.size:]
            try:
                tenant = text[:tlen].decode("utf-8", "surrogatepass")
                key = text[tlen:tlen + klen].decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                break
            live[alloc_id] = JournalEntry(alloc_id, segment_id, offset, length, checksum, epoch,
                                          expiry, tenant, key)
        elif kind == KIND_DROPPED and body_len == _DROPPED.size:
            live.pop(_DROPPED.unpack_from(body, 0)[1], None)
        elif kind == KIND_ENGINE_HASH and body_len > _ENGINE_HASH.size:
            _, alloc_id, hash_len = _ENGINE_HASH.unpack_from(body, 0)
            if not 0 < hash_len <= MAX_ENGINE_HASH_BYTES or _ENGINE_HASH.size + hash_len != body_len:
                break
            entry = live.get(alloc_id)
            if entry is not None:
                entry.engine_hash = bytes(body[_ENGINE_HASH.size:])
        elif kind == KIND_VALUE_ID and body_len == _ID_PAIR.size:
            _, alloc_id, value_id = _ID_PAIR.unpack_from(body, 0)
            entry = live.get(alloc_id)
            if entry is not None and 0 < value_id < alloc_id:  # a copy is newer than its value
                entry.value_id = value_id
        elif kind == KIND_SOFT_PIN and body_len == _ID_PAIR.size:
            _, alloc_id, until_ms = _ID_PAIR.unpack_from(body, 0)
            entry = live.get(alloc_id)
            if entry is not None:
                entry.soft_pin_until_ms = until_ms
        else:
            break
        pos = start + body_len
        records += 1
    return live, pos, records


class IndexJournal:
    """The append-only journal file of one node (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        self.live = 0
        self.dead = 0
        self.compactions = 0
        self.failed = False
        self._queued: list[bytes] = []  # deferred records, not written yet (see flush)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> tuple[IndexJournal, list[JournalEntry]]:
        """Replay the file at `path` (if any), compact it, and open it for appending."""
        journal = cls(Path(path))
        entries: list[JournalEntry] = []
        try:
            data = journal.path.read_bytes()
        except FileNotFoundError:
            data = b""
        if data:
            live, valid, records = replay(data)
            if valid < len(data):
                log.warning("journal %s: ignoring %d bytes of torn or unreadable tail",
                            journal.path, len(data) - valid)
            entries = list(live.values())
            log.info("journal %s: %d records replayed, %d live entries", journal.path, records,
                     len(entries))
        journal.rewrite(entries)
        return journal, entries

    def rewrite(self, entries: list[JournalEntry]) -> None:
        """Replace the file with exactly `entries` (atomically: temp file, then rename).
        Queued records are dropped: `entries` is the whole live state, theirs included."""
        self._queued = []
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            chunk = [MAGIC]
            size = len(MAGIC)
            for e in entries:
                record = _encode_entry(e)
                chunk.append(record)
                size += len(record)
                if size >= 1 << 20:
                    _write_all(fd, b"".join(chunk))
                    chunk, size = [], 0
            _write_all(fd, b"".join(chunk))
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.live = len(entries)
        self.dead = 0
        self.compactions += 1

    def sealed(self, entry: SealedRecord, *, defer: bool = False) -> None:
        """Record a SEALED entry; with `defer`, at the next `flush` (or any other append)."""
        if self._fd >= 0:
            if defer and len(self._queued) < MAX_QUEUED_RECORDS:
                self._queued.append(_encode_entry(entry))
            else:
                self._append(_encode_entry(entry))
            self.live += 1

    def engine_hash(self, alloc_id: int, engine_hash: bytes, *, defer: bool = False) -> None:
        """Record the engine hash of a SEALED entry; with `defer`, at the next `flush`."""
        self._note(_encode_engine_hash(alloc_id, engine_hash), defer)

    def soft_pin(self, alloc_id: int, until_ms: int, *, defer: bool = False) -> None:
        """Record the soft pin of a SEALED entry; with `defer`, at the next `flush`."""
        self._note(_encode_id_pair(KIND_SOFT_PIN, alloc_id, until_ms), defer)

    def _note(self, record: bytes, defer: bool) -> None:
        """A record adding to a SEALED entry (an engine hash, a soft pin)."""
        if self._fd >= 0:
            if defer and len(self._queued) < MAX_QUEUED_RECORDS:
                self._queued.append(record)
            else:
                self._append(record)
            self.dead += 1  # replaced by the SEALED record's pair at the next compaction

    @property
    def queued(self) -> bool:
        """Whether deferred records wait for `flush`."""
        return bool(self._queued)

    def flush(self) -> None:
        """Write the deferred records (one write() for all of them)."""
        if self._queued:
            self._append(b"")

    def dropped(self, alloc_id: int, *, defer: bool = False) -> None:
        """Record the drop of a SEALED entry; with `defer`, at the next `flush`."""
        if self._fd >= 0:
            if defer and len(self._queued) < MAX_QUEUED_RECORDS:
                self._queued.append(_encode_dropped(alloc_id))
            else:
                self._append(_encode_dropped(alloc_id))
            self.live -= 1
            self.dead += 2  # the SEALED record and this one

    def _append(self, record: bytes) -> None:
        if self._queued:
            self._queued.append(record)
            record = b"".join(self._queued)
            self._queued = []
        if self._fd < 0:
            return
        try:
            _write_all(self._fd, record)
        except OSError as exc:
            log.error("journal %s: append failed (%s); deleting it, a restart will not "
                      "re-attach objects", self.path, exc.strerror)
            self.failed = True
            self.close(unlink=True)

    def wants_compaction(self) -> bool:
        return not self.failed and self.dead > COMPACT_MIN_DEAD and self.dead > 2 * self.live

    def close(self, *, unlink: bool = False) -> None:
        if not unlink:
            self.flush()
        self._queued = []
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if unlink:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
