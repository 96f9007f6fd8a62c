"""The removal log: what makes an acknowledged remove or upsert outlive the master that took it.

The problem. A master forgets everything when it dies; a new one (a restart, or a standby
taking over) rebuilds its table from the nodes' index reports (master/node_rpcs.py). A node
drops a freed range from its index only when it hears of it, on a heartbeat reply, so for about
a heartbeat after a remove or an upsert the node still holds and would report the old value;
the dead master's pending notices die with it. Without this log the new master re-created it.

The choice. Every remove (Remove, RemovePrefix, RemoveAll, and a remove of a key the master
does not hold) and every upsert leaves a tombstone bound (state/tombstones.py: every allocation
of the key with an id at or below the bound is dead). Before the reply that acknowledges it
goes out, the servicer hands the request's new bounds to this log and awaits it; a new master
loads the log before it adopts any report, and rebuild refuses every reported entry at or below
its key's bound. The alternative, waiting for the nodes holding the old allocation to journal
the drop, would tie a remove's latency to the slowest (or a stopped) node's next heartbeat.

Two backends, one interface (`append`, awaited; records are (tenant, key, bound, by), `by`
the tag of the Remove request that set the bound, so a new master answers its repeat OK, or
DEAD_WRITE for the one allocation of a write dropped before it completed: a put-ahead write
refused at PutEnd, a revoked or timed-out put, state/tombstones.py):
- `FileRemovalLog` (a single master): one JSON line per bound, appended with one `write` per
  request before the reply. The bytes are in the kernel's page cache when the reply leaves, so
  they survive a kill -9 of the master (not a crash of the host: no fsync, a few microseconds
  instead of milliseconds). Replayed on start up to the first torn line; rewritten from the
  table of bounds (atomic rename) once it holds `COMPACT_FACTOR` x that table plus
  `COMPACT_SLACK_RECORDS` lines.
- `EtcdRemovalLog` (HA): each batch is one etcd key under `/cellar/<cluster>/removals/`,
  written in a transaction that holds only while this master's record is the leader's (a
  deposed leader's late write fails). Requests that arrive while a write is in flight are
  batched into the next one (group commit: one etcd round trip serves them all). The election
  reads every value under the prefix when it wins, before it serves (coord/election.py);
  compaction writes the table of bounds as new keys, then deletes the older ones, once the
  log holds `COMPACT_FACTOR` x that table plus `ETCD_COMPACT_SLACK_RECORDS` (small: each
  election reads the whole log before the new leader serves, so its size is failover time).
A write that fails answers the request UNAVAILABLE (the remove took effect in this master's
memory, but is not acknowledged); its bounds stay queued and go out with the next remove's or
upsert's write (serving/leadership.py), so what this master holds becomes durable too. The
request's repeat (same request id: the reply memory answers it, the body does not run again)
waits for that write as well, so it is acknowledged only once its bounds are in the log. Records off disk or etcd are
bounds-checked like anything off the wire. This module holds no metadata of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cellar.master.state.ids import MAX_ID
from cellar.master.state.tombstones import TombstoneRecord

if TYPE_CHECKING:
    from cellar.coord.election import LeaderElection

log = logging.getLogger("cellar.master")

MAX_RECORD_TENANT_CHARS = 256      # a tenant name in a record (config caps names lower)
MAX_RECORD_KEY_BYTES = 64 * 1024   # a key in a record (max_key_bytes is 1 KiB by default)
MAX_RECORD_TAG_CHARS = 64         # a request tag (request_memory.request_tag: 32 hex digits)
MAX_LINE_BYTES = 256 * 1024        # one record line of the file
MAX_ETCD_VALUE_BYTES = 512 * 1024  # one etcd value (etcd's request limit is 1.5 MiB)
COMPACT_FACTOR = 2                 # rewrite once the log holds this x the live bounds ...
COMPACT_SLACK_RECORDS = 65_536     # ... plus this many records (the file: read only at a restart)
# etcd: every election reads the whole log before the new leader serves, so its slack is small.
# At 65,536 a 10-minute soak's log (~64k bounds of 256 keys) never compacted and the takeover
# grew from 3 s to 6.5 s over the run as the log grew (make soak-ha).
ETCD_COMPACT_SLACK_RECORDS = 4_096
DISABLED = "none"                  # removal_log_file value that turns the file log off


def encode(records: Iterable[TombstoneRecord]) -> bytes:
    """One JSON line per record: ["tenant", "key", bound] or, when a Remove request set the
    bound, ["tenant", "key", bound, "request tag"]."""
    return b"".join(json.dumps([t, k, b, by] if by else [t, k, b], ensure_ascii=False,
                               separators=(",", ":")).encode() + b"\n"
                    for t, k, b, by in records)


def decode(data: bytes) -> tuple[list[TombstoneRecord], int]:
    """The records of `data` and how many lines were refused (malformed, out of bounds, torn)."""
    records: list[TombstoneRecord] = []
    refused = 0
    for line in data.split(b"\n"):
        if not line:
            continue
        record = _record(line)
        if record is None:
            refused += 1
        else:
            records.append(record)
    return records, refused


def _record(line: bytes) -> TombstoneRecord | None:
    if len(line) > MAX_LINE_BYTES:
        return None
    try:
        item = json.loads(line)
    except ValueError:
        return None
    if not (isinstance(item, list) and len(item) in (3, 4)):
        return None
    tenant, key, bound = item[:3]
    by = item[3] if len(item) == 4 else ""
    if not (isinstance(tenant, str) and isinstance(key, str) and type(bound) is int
            and isinstance(by, str) and len(by) <= MAX_RECORD_TAG_CHARS):
        return None
    if len(tenant) > MAX_RECORD_TENANT_CHARS or not key or len(key.encode()) > MAX_RECORD_KEY_BYTES:
        return None
    if not 0 < bound <= MAX_ID:
        return None
    return tenant, key, bound, by


def chunks(records: list[TombstoneRecord], limit_bytes: int) -> list[bytes]:
    """`records` encoded as values of at most about `limit_bytes` each."""
    out: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for record in records:
        line = encode((record,))
        if current and size + len(line) > limit_bytes:
            out.append(b"".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        out.append(b"".join(current))
    return out


class FileRemovalLog:
    """A single master's removal log: an append-only file of JSON lines (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records_written = 0
        self._live_seen = 0  # the live bounds at the last look (a snapshot is O(live))
        self.refused_on_load = 0
        self._fd = -1

    def load(self) -> list[TombstoneRecord]:
        """Every bound in the file (none if it does not exist); opens it for appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        records, self.refused_on_load = decode(data)
        if self.refused_on_load:
            log.warning("removal log %s: %d unreadable line(s) skipped (a torn last write?)",
                        self.path, self.refused_on_load)
        self.records_written = len(records)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return records

    async def append(self, records: list[TombstoneRecord], snapshot: Callable[[], list[TombstoneRecord]]) -> None:
        assert self._fd >= 0, "append before load"
        data = encode(records)
        view = memoryview(data)
        while view:  # a regular file takes it whole; loop anyway (a short write is legal)
            view = view[os.write(self._fd, view):]
        self.records_written += len(records)
        if self.records_written > COMPACT_FACTOR * self._live_seen + COMPACT_SLACK_RECORDS:
            current = snapshot()  # O(live bounds): only once the log may have outgrown them
            self._live_seen = len(current)
            if self.records_written > COMPACT_FACTOR * len(current) + COMPACT_SLACK_RECORDS:
                self._compact(current)

    def _compact(self, current: list[TombstoneRecord]) -> None:
        replace_file(self.path, encode(current))
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.records_written = len(current)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class EtcdRemovalLog:
    """The HA removal log: batches of bounds as etcd keys, written by the leader only."""

    def __init__(self, election: LeaderElection) -> None:
        self.election = election
        self.records_written = 0
        self._live_seen = 0  # the live bounds at the last look (a snapshot is O(live))
        self._seq = 0
        self._epoch = 0
        self._waiting: list[tuple[list[TombstoneRecord], asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches_written = 0

    def load(self, epoch: int) -> list[TombstoneRecord]:
        """The bounds the election read at its win (coord/election.py), for the new leader."""
        self._epoch, self._seq = epoch, 0
        self._waiting.clear()
        records: list[TombstoneRecord] = []
        refused = 0
        for value in self.election.removal_values:
            got, bad = decode(value)
            records += got
            refused += bad
        if refused:
            log.warning("removal log in etcd: %d unreadable record(s) skipped", refused)
        self.records_written = len(records)
        return records

    def _key(self) -> str:
        self._seq += 1
        return f"{self.election.target.removals_prefix}{self._epoch:016x}/{self._seq:010x}"

    async def append(self, records: list[TombstoneRecord], snapshot: Callable[[], list[TombstoneRecord]]) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((records, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush(snapshot))
        await future

    async def _flush(self, snapshot: Callable[[], list[TombstoneRecord]]) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            records = [record for recs, _ in batch for record in recs]
            error: Exception | None = None
            try:
                for value in chunks(records, MAX_ETCD_VALUE_BYTES):
                    if not await self.election.write_as_leader({self._key(): value}):
                        raise ConnectionError("not the leader any more: the removal log was not written")
                self.records_written += len(records)
                self.batches_written += 1
            except Exception as exc:  # noqa: BLE001 - etcd trouble of any kind: not acknowledged
                error = exc
            for _records, future in batch:
                if not future.done():
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(error)
            if error is None and self.records_written > \
                    COMPACT_FACTOR * self._live_seen + ETCD_COMPACT_SLACK_RECORDS:
                await self._maybe_compact(snapshot)

    async def _maybe_compact(self, snapshot: Callable[[], list[TombstoneRecord]]) -> None:
        current = snapshot()  # O(live bounds): only once the log may have outgrown them
        self._live_seen = len(current)
        if self.records_written <= COMPACT_FACTOR * len(current) + ETCD_COMPACT_SLACK_RECORDS:
            return
        try:
            first = ""
            for value in chunks(current, MAX_ETCD_VALUE_BYTES):
                key = self._key()
                first = first or key
                if not await self.election.write_as_leader({key: value}):
                    return
            if first:  # every key before the snapshot's first is covered by the snapshot
                prefix = self.election.target.removals_prefix
                await self.election.write_as_leader({}, delete_range=(prefix, first))
            self.records_written = len(current)
        except Exception as exc:  # noqa: BLE001 - compaction is retried after the next batch
            log.warning("could not compact the removal log in etcd: %s", exc)


def default_path(listen: str) -> Path:
    """~/.cellar/removals-<listen address>.log: one per master address on this host."""
    return listen_file("removals", listen, ".log")


def replace_file(path: Path, data: bytes) -> None:
    """Make `data` the whole of `path`, all or nothing (a temp file beside it, fsync, rename):
    a single master's compacted removal log, its tenant log. Owner-only, as the logs are."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:  # a regular file takes it whole; loop anyway (a short write is legal)
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def listen_file(stem: str, listen: str, suffix: str) -> Path:
    """~/.cellar/<stem>-<listen address><suffix>: a single master's file, one per address."""
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in listen)
    return Path("~/.cellar").expanduser() / f"{stem}-{safe}{suffix}"


def json_records(values: Iterable[tuple[bytes, bytes]], prefix: str, max_bytes: int,
                 what: str) -> Iterator[tuple[str, Any]]:
    """(name under `prefix`, decoded JSON) of each etcd (key, value) an election read for a log
    of one key per record (the tenant and token logs); a value over `max_bytes` or not JSON is
    skipped with a log line naming `what`."""
    raw_prefix = prefix.encode()
    for key, value in values:
        name = key[len(raw_prefix):].decode("utf-8", "replace") if key.startswith(raw_prefix) else ""
        if len(value) > max_bytes:
            log.warning("%s in etcd: record %r over %d bytes skipped", what, name, max_bytes)
            continue
        try:
            yield name, json.loads(value)
        except (ValueError, RecursionError):
            log.warning("%s in etcd: record %r is not JSON; skipped", what, name)
