"""`Client`: the blocking face of the SDK.

What it owns
    The I/O that `core` plans: gRPC calls to the master through `MasterChannel` and payload
    transfers through the transports (`cellar.transfer`), plus one background thread that
    releases pins nobody else carried to the master within `UNPIN_DELAY_S`.

Thread safety
    A `Client` may be shared by any number of threads. Per-call state lives in the call's own
    `PutBatch`/`GetBatch`; the shared pieces (gRPC channel, transports, `NodeHealth`,
    `UnpinQueue`) are thread-safe themselves.

Deadlines
    Every public call gets `timeout_s` (from `connect`) for everything it does: master RPCs,
    their retries, transfers and put retries on other nodes. When it runs out the call raises
    `cellar.Timeout` (or `cellar.Unavailable` if the master was unreachable throughout).

Leader changes
    With an `etcd://` address (or a standby's redirect) the master channel follows the leader
    (rpc.py). Calls in flight when the leader dies are retried there within their deadline;
    puts whose keys the change left UNAVAILABLE (a node refused the old epoch's grant, the new
    leader's nodes are still mounting) are placed again, and gets whose batch straddled the
    change ask the new leader for fresh grants.

Copies
    None on CPython. `put` sends straight from the caller's buffer. `get_into` /
    `get_many_into` receive straight into the caller's buffer (checked for size before any
    transfer). `get` / `get_many` receive straight into the `bytes` objects they return (see
    `buffers.fresh_bytes`; one copy on other interpreters). Fresh memory still costs its page
    faults, so hot loops should reuse `cellar.alloc_buffer` buffers with the `_into` calls.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any

from cellar.client import core
from cellar.client.buffers import writable_view
from cellar.client.core import (
    GetBatch,
    GetEntry,
    Limits,
    NodeHealth,
    PutBatch,
    PutEntry,
    TransportSet,
    UnpinQueue,
)
from cellar.client.rpc import MasterChannel
from cellar.coord.target import EtcdTarget, is_etcd_url, parse_etcd_url
from cellar.credentials import default_token
from cellar.errors import CellarError, InvalidArgument, Status, Timeout
from cellar.proto import cellar_pb2 as pb
from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_CONNECTION_LOST,
    ST_TIMEOUT,
    TransferOp,
    TransferResult,
    Transport,
)
from cellar.units import parse_host_port

UNPIN_FLUSH_TIMEOUT_S = 5.0
# Riding through a master failover (rpc.py follows the leader; these re-place what it voided).
FAILOVER_SETTLE_S = 10.0          # after following a leader change, this long counts as "lately"
MAX_FAILOVER_ROUNDS = 32          # put rounds for keys a leader change left UNAVAILABLE
FAILOVER_BACKOFF_FIRST_S = 0.05
FAILOVER_BACKOFF_MAX_S = 0.5
FAILOVER_PUT_STATUSES = frozenset({Status.UNAVAILABLE, Status.NO_SPACE})
MAX_GET_FAILOVER_ROUNDS = 2       # gets whose batch straddled a leader change, asked again
CLOSE_FLUSH_TIMEOUT_S = 1.0
# Put values are hashed on a helper thread while PutStart is in flight when a round has at
# least this many bytes to hash (below it, the thread hop costs more than the overlap saves).
HASH_BEHIND_MIN_BYTES = 1 << 20
HASH_THREADS = 2                  # shared by every call of one client
CLOSE_FLUSH_MAX_CALLS = 8

_PROCESS_CLIENT_ID: tuple[int, str] | None = None


def _client_id() -> str:
    """Stable for this process (pins and puts are attributed to it); renewed after fork."""
    global _PROCESS_CLIENT_ID
    pid = os.getpid()
    if _PROCESS_CLIENT_ID is None or _PROCESS_CLIENT_ID[0] != pid:
        _PROCESS_CLIENT_ID = (pid, f"{socket.gethostname()}/{pid}/{secrets.token_hex(4)}")
    return _PROCESS_CLIENT_ID[1]


def parse_master_address(address: str) -> EtcdTarget | None:
    """None for a master's "host:port", the etcd target for "etcd://HOST:PORT[,...]/CLUSTER";
    `cellar.InvalidArgument` for anything else."""
    if is_etcd_url(address):
        return parse_etcd_url(address)
    try:
        if "://" in address:
            raise ValueError("only etcd:// addresses have a scheme")
        parse_host_port(address)
    except ValueError:
        raise InvalidArgument(f"address must be 'host:port' or 'etcd://HOST:PORT[,...]/CLUSTER', "
                              f"got {address!r}") from None
    return None


def open_transports(choice: str) -> TransportSet:
    """Open the transports `connect(transport=choice)` asks for, in preference order."""
    from cellar.transfer import make_transport

    names = core.transport_names(choice)
    opened: list[Transport] = []
    for name in names:
        try:
            opened.append(make_transport(name))
        except Exception as exc:
            if choice == "auto" and name != names[-1]:
                continue  # an optional transport this machine lacks (e.g. no RDMA device)
            for t in opened:
                t.close()
            raise InvalidArgument(f"transport {name!r} is not available here: {exc}") from None
    return TransportSet(opened)


class _UnpinFlusher:
    """Sends queued pin releases that no GetReplicas carried within `UNPIN_DELAY_S`."""

    def __init__(self, queue: UnpinQueue, send: Callable[[list[int]], None],
                 max_ids: Callable[[], int]) -> None:
        self._queue = queue
        self._send = send
        self._max_ids = max_ids  # the master's batch limit applies to pin ids too
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cellar-unpin", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while self._queue.wait_due():
            self.flush()

    def flush(self, max_calls: int = 1) -> None:
        for _ in range(max_calls):
            ids = self._queue.drain(self._max_ids())
            if not ids:
                return
            try:
                self._send(ids)
            except (CellarError, ValueError):  # ValueError: channel closed under us
                return  # the master's pin TTL releases them; never fail a caller for this

    def stop(self, join_timeout_s: float = 0.0) -> None:
        self._queue.close()
        thread = self._thread
        if thread is not None and join_timeout_s > 0 and thread is not threading.current_thread():
            thread.join(join_timeout_s)


class Client:
    """A connection to one Cellar cluster for one tenant. Create it with `cellar.connect`."""

    def __init__(self, address: str, *, tenant: str = "default", token: str | None = None,
                 timeout_s: float = 30.0, transport: str = "auto") -> None:
        if not isinstance(address, str):
            raise InvalidArgument(f"address must be a 'host:port' str, not {type(address).__name__}")
        target = parse_master_address(address)
        if token is not None and not isinstance(token, str):
            raise InvalidArgument(f"token must be a str or None, not {type(token).__name__}")
        self.address = address
        self.tenant = core.validate_tenant(tenant)
        self.timeout_s = core.validate_timeout(timeout_s)
        core.transport_names(transport)  # refuse unknown names before opening anything
        if token is None:  # $CELLAR_TOKEN, else the file `cellar up` wrote (cellar.credentials)
            token = default_token(address)
        self._header = pb.RequestHeader(tenant=self.tenant, client_id=_client_id(),
                                        token=token or "")
        self._closed = False
        self._hasher: ThreadPoolExecutor | None = None  # hashes put values behind PutStart
        self._hasher_lock = threading.Lock()
        deadline = self._deadline()
        self._discovery: Any = None
        master_address = address
        if target is not None:
            # etcd names the leader; it is also asked again whenever the leader stops serving.
            from cellar.coord.discovery import LeaderDiscovery

            self._discovery = LeaderDiscovery(target)
            try:
                master_address = self._discovery.wait_for_leader(self.timeout_s).address
            except BaseException:
                self._discovery.close()
                raise
        self._health = NodeHealth()
        self._unpins = UnpinQueue()
        self._transports = open_transports(transport)
        self._master = MasterChannel(
            master_address, resolve=None if target is None else self._leader_from_etcd)
        self.limits = Limits()
        self._flusher = _UnpinFlusher(self._unpins, self._send_unpins, self._unpin_batch)
        self._finalizer = weakref.finalize(self, _UnpinFlusher.stop, self._flusher)
        try:
            reply = self._master.call("ClusterStatus", pb.ClusterStatusRequest(header=self._header),
                                      deadline)
        except BaseException:
            self.close()
            raise
        self.limits = Limits.from_status(reply)

    def _leader_from_etcd(self, timeout_s: float) -> str:
        """The leader's address as etcd knows it now; "" during an election."""
        record = self._discovery.leader(timeout_s)
        return record.address if record is not None else ""

    @property
    def master_address(self) -> str:
        """HOST:PORT of the master this client talks to now (the leader it follows)."""
        return self._master.address

    # ---- context manager and lifecycle -----------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<cellar.Client {self.address} tenant={self.tenant!r} {state}>"

    def close(self) -> None:
        """Release queued pins (best effort), stop the flusher, close connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._flusher.stop(join_timeout_s=CLOSE_FLUSH_TIMEOUT_S)
        self._flusher.flush(max_calls=CLOSE_FLUSH_MAX_CALLS)
        self._transports.close()
        with self._hasher_lock:
            hasher, self._hasher = self._hasher, None
        if hasher is not None:
            hasher.shutdown(wait=True)
        self._master.close()
        if self._discovery is not None:
            self._discovery.close()

    # ---- put -------------------------------------------------------------------------------

    def put(self, key: str, value: Any, *, replicas: int = 1, soft_pin: bool = False) -> None:
        """Store `value` under `key`; raises `cellar.AlreadyExists` if the key exists.

        `value` is any C-contiguous buffer (bytes, bytearray, memoryview, numpy array, ...) of
        at least one byte. Every replica is written (in parallel) before the object becomes
        visible; on failure the put is revoked and the error raised.
        """
        self._put_one(key, value, replicas=replicas, soft_pin=soft_pin, upsert=False)

    def upsert(self, key: str, value: Any, *, replicas: int = 1, soft_pin: bool = False) -> None:
        """Store `value` under `key`, replacing any existing value."""
        self._put_one(key, value, replicas=replicas, soft_pin=soft_pin, upsert=True)

    def put_many(self, items: Any, *, replicas: int = 1, soft_pin: bool = False) -> list[Status]:
        """Store many values; one `cellar.Status` per item in input order.

        `items` is a mapping or a sequence of (key, value) pairs (keys unique). A key that
        exists reports `Status.ALREADY_EXISTS` (a cache treats that as success); keys that could
        not be written report their status instead of raising. Bad arguments raise
        `cellar.InvalidArgument` before anything is sent; an unreachable master raises.
        """
        self._check_open()
        pairs = core.normalize_items(items, self.limits.max_key_bytes)
        replicas = core.validate_replicas(replicas)
        entries = self._run_puts(core.put_entries(pairs), replicas=replicas,
                                 soft_pin=bool(soft_pin), upsert=False, deadline=self._deadline())
        return [e.status if e.status is not None else Status.INTERNAL for e in entries]

    def _put_one(self, key: str, value: Any, *, replicas: int, soft_pin: bool, upsert: bool) -> None:
        self._check_open()
        key = core.validate_key(key, self.limits.max_key_bytes)
        view = core.validate_value(value)
        replicas = core.validate_replicas(replicas)
        (entry,) = self._run_puts(core.put_entries([(key, view)]), replicas=replicas,
                                  soft_pin=bool(soft_pin), upsert=upsert, deadline=self._deadline())
        if entry.status != Status.OK:
            raise entry.error()

    def _run_puts(self, entries: list[PutEntry], *, replicas: int, soft_pin: bool, upsert: bool,
                  deadline: float) -> list[PutEntry]:
        for span in core.batch_ranges(len(entries), self.limits.max_batch_keys):
            chunk = entries[span.start:span.stop]
            generation = self._master.generation
            self._put_batch(chunk, replicas=replicas, soft_pin=soft_pin, upsert=upsert,
                            deadline=deadline)
            # Keys a leader change left UNAVAILABLE (a node refused the old epoch's grant, or
            # the new leader's nodes are still mounting) are placed again while time is left.
            backoff_s = FAILOVER_BACKOFF_FIRST_S
            for _round in range(MAX_FAILOVER_ROUNDS):
                again = [i for i, e in enumerate(chunk) if e.status in FAILOVER_PUT_STATUSES]
                if not again or not self._near_failover(generation):
                    break
                if deadline - time.monotonic() <= backoff_s + core.MIN_RETRY_BUDGET_S:
                    break
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, FAILOVER_BACKOFF_MAX_S)
                fresh = [PutEntry(chunk[i].key, chunk[i].value, chunk[i].checksum) for i in again]
                self._put_batch(fresh, replicas=replicas, soft_pin=soft_pin, upsert=upsert,
                                deadline=deadline)
                for i, entry in zip(again, fresh, strict=True):
                    chunk[i].status, chunk[i].message = entry.status, entry.message
            if not upsert and self._near_failover(generation):
                self._settle_own_writes(chunk, deadline)
        return entries

    def _settle_own_writes(self, chunk: list[PutEntry], deadline: float) -> None:
        """A put whose bytes reached the nodes just before the leader died is adopted by the new
        leader from the nodes' indexes; placing it again then finds the key taken. If the stored
        object has exactly our size and checksum, it is our write: report OK, not AlreadyExists."""
        taken = [e for e in chunk if e.status == Status.ALREADY_EXISTS]
        if not taken:
            return
        core.hash_values(taken)  # refused at their first PutStart, they may be unhashed
        request = pb.GetReplicasRequest(header=self._header, keys=[e.key for e in taken])
        try:
            reply = self._master.call("GetReplicas", request, deadline)
        except CellarError:
            return  # they stay ALREADY_EXISTS: true, if not the whole story
        core.check_result_count("GetReplicas", len(reply.results), len(taken))
        self._release([int(r.pin_id) for r in reply.results if r.pin_id])
        for entry, result in zip(taken, reply.results, strict=True):
            if (core.to_status(result.status) == Status.OK
                    and int(result.size_bytes) == len(entry.value)
                    and int(result.checksum) == entry.checksum):
                entry.status, entry.message = Status.OK, ""

    def _near_failover(self, generation: int) -> bool:
        """Whether this client followed a leader change since `generation`, or lately."""
        return (self._master.generation != generation
                or time.monotonic() - self._master.switched_at < FAILOVER_SETTLE_S)

    def _put_batch(self, entries: list[PutEntry], *, replicas: int, soft_pin: bool, upsert: bool,
                   deadline: float) -> None:
        batch = PutBatch(entries, tenant=self.tenant, replicas=replicas, soft_pin=soft_pin,
                         upsert=upsert, health=self._health)
        try:
            self._drive_put(batch, deadline)
        except BaseException as exc:
            refs = batch.abandon(str(exc) or type(exc).__name__)
            if refs:
                self._revoke(refs, deadline)
            raise

    def _drive_put(self, batch: PutBatch, deadline: float) -> None:
        while (request := batch.start_request(self._header)) is not None:
            hashing = self._hash_behind(batch.entries)
            try:
                reply = self._master.call("PutStart", request, deadline)
            finally:
                if hashing is not None:  # done or failed: on_start_reply hashes what is left
                    futures.wait([hashing])
            ops = batch.on_start_reply(reply)
            results = self._transfer("write", ops, deadline, batch.can_retry())
            may_retry = deadline - time.monotonic() > core.MIN_RETRY_BUDGET_S
            end_items, revoke_items = batch.on_write_results(results, may_retry=may_retry)
            if revoke_items:
                self._revoke(revoke_items, deadline)
            if end_items:
                reply = self._master.call(
                    "PutEnd", pb.PutEndRequest(header=self._header, items=end_items), deadline)
                batch.on_end_reply(reply)

    def _hash_behind(self, entries: list[PutEntry]) -> Future[None] | None:
        """Hash the values on a helper thread while PutStart is in flight (the master needs
        only their sizes); None when there is too little to hash to be worth the hop."""
        if core.unhashed_bytes(entries) < HASH_BEHIND_MIN_BYTES:
            return None
        with self._hasher_lock:
            if self._closed:  # a put racing close(): no new thread, on_start_reply hashes
                return None
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="cellar-hash")
            return self._hasher.submit(core.hash_values, entries)

    def _revoke(self, refs: list[Any], deadline: float) -> None:
        """Best effort: if the master cannot be told, its writer timeout revokes the put."""
        try:
            self._master.call("PutRevoke", pb.PutRevokeRequest(header=self._header, items=refs),
                              max(deadline, time.monotonic() + 1.0))
        except CellarError:
            pass

    # ---- get -------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """The value under `key`; raises `cellar.NotFound` if there is none."""
        self._check_open()
        key = core.validate_key(key, self.limits.max_key_bytes)
        (entry,) = self._run_gets([key], None, self._deadline())
        if entry.status != Status.OK:
            core.release_views([entry])
            raise entry.error()
        return core.take_value(entry)

    def get_into(self, key: str, buffer: Any) -> int:
        """Read the value under `key` into `buffer`; returns its size in bytes.

        Raises `cellar.NotFound`, or `cellar.BufferTooSmall` (before any transfer) when the
        value does not fit. Bytes past the value's size are left untouched.
        """
        self._check_open()
        key = core.validate_key(key, self.limits.max_key_bytes)
        dest = writable_view(buffer, "buffer")
        (entry,) = self._run_gets([key], [dest], self._deadline())
        if entry.status != Status.OK:
            raise entry.error()
        return entry.size

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values for `keys` in input order; None for a key that is missing or unreadable
        (not found, still being written, or every replica unreachable). Raises
        `cellar.IntegrityError` if a value is found but no replica passes its checksum."""
        self._check_open()
        names = core.validate_keys(keys, self.limits.max_key_bytes)
        entries = self._run_gets(names, None, self._deadline())
        try:
            for entry in entries:
                core.miss_or_raise(entry)
            return [core.take_value(e) if e.status == Status.OK else None for e in entries]
        finally:
            core.release_views(entries)

    def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[int]:
        """Read each key into its buffer; sizes in input order, -1 for a miss (as `get_many`).

        Every buffer is checked before any transfer: `cellar.BufferTooSmall` names the first
        key whose value does not fit.
        """
        self._check_open()
        names = core.validate_keys(keys, self.limits.max_key_bytes)
        if isinstance(buffers, (bytes, bytearray, memoryview, str)) or not hasattr(buffers, "__len__"):
            raise InvalidArgument("buffers must be a sequence with one buffer per key")
        if len(buffers) != len(names):
            raise InvalidArgument(f"{len(names)} keys but {len(buffers)} buffers")
        dests = [writable_view(b, f"buffers[{i}]") for i, b in enumerate(buffers)]
        out: list[int] = []
        for entry in self._run_gets(names, dests, self._deadline()):
            core.miss_or_raise(entry)
            out.append(entry.size if entry.status == Status.OK else -1)
        return out

    def size(self, key: str) -> int:
        """The size in bytes of the value under `key`; raises `cellar.NotFound`."""
        self._check_open()
        key = core.validate_key(key, self.limits.max_key_bytes)
        unpins = self._unpins.drain(self._unpin_batch())
        request = pb.GetReplicasRequest(header=self._header, keys=[key], unpin_ids=unpins)
        try:
            reply = self._master.call("GetReplicas", request, self._deadline())
        except BaseException:
            self._unpins.requeue(unpins)
            raise
        core.check_result_count("GetReplicas", len(reply.results), 1)
        result = reply.results[0]
        self._release([int(result.pin_id)])
        status = core.to_status(result.status)
        if status != Status.OK:
            raise core.status_error(status, result.message, key)
        return int(result.size_bytes)

    def _run_gets(self, keys: list[str], dests: list[memoryview] | None,
                  deadline: float) -> list[GetEntry]:
        entries: list[GetEntry] = []
        for span in core.batch_ranges(len(keys), self.limits.max_batch_keys):
            chunk = self._get_batch(keys[span.start:span.stop],
                                    None if dests is None else dests[span.start:span.stop],
                                    entries, deadline)
            entries.extend(chunk)
        return entries

    def _get_batch(self, keys: list[str], dests: list[memoryview] | None,
                   done: list[GetEntry], deadline: float) -> list[GetEntry]:
        """One batch's entries; keys whose grants a leader change voided (the nodes mounted at
        the new leader and refuse the old epoch) are asked for again at the new leader."""
        out: list[GetEntry] = []
        index = list(range(len(keys)))
        for _round in range(MAX_GET_FAILOVER_ROUNDS + 1):
            generation = self._master.generation
            batch = GetBatch([keys[i] for i in index],
                             None if dests is None else [dests[i] for i in index],
                             health=self._health)
            try:
                self._get_replicas(batch, deadline)
                while ops := batch.next_ops():
                    results = self._transfer("read", ops, deadline, batch.can_fall_back())
                    batch.on_read_results(results)
            except BaseException:
                core.release_views(done + out + batch.entries)
                raise
            finally:
                self._release(batch.pin_ids)
            if not out:
                out = batch.entries
            else:
                for i, entry in zip(index, batch.entries, strict=True):
                    core.release_views([out[i]])
                    out[i] = entry
            if self._master.generation == generation:
                break
            index = [i for i in index if out[i].status == Status.UNAVAILABLE and not out[i].corrupt]
            if not index or deadline - time.monotonic() <= core.MIN_RETRY_BUDGET_S:
                break
        return out

    def _get_replicas(self, batch: GetBatch, deadline: float) -> None:
        unpins = self._unpins.drain(self._unpin_batch())
        try:
            reply = self._master.call("GetReplicas", batch.request(self._header, unpins), deadline)
        except BaseException:
            self._unpins.requeue(unpins)
            raise
        batch.on_reply(reply)

    def _release(self, pin_ids: list[int]) -> None:
        if not pin_ids:
            return
        if self._unpins.add(pin_ids) or self._closed:
            self._flusher.flush(max_calls=CLOSE_FLUSH_MAX_CALLS)
        else:
            self._flusher.ensure_started()

    def _send_unpins(self, ids: list[int]) -> None:
        timeout_s = CLOSE_FLUSH_TIMEOUT_S if self._closed else UNPIN_FLUSH_TIMEOUT_S
        self._master.call("Unpin", pb.UnpinRequest(header=self._header, pin_ids=ids),
                          time.monotonic() + min(self.timeout_s, timeout_s))

    def _unpin_batch(self) -> int:
        return min(core.MAX_UNPINS_PER_CALL, self.limits.max_batch_keys)

    # ---- probes and removal ----------------------------------------------------------------

    def exists(self, key: str) -> bool:
        """Whether a complete value is stored under `key` (never pins it)."""
        return self.exists_many([key])[0]

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key has a complete value, in input order (never pins)."""
        self._check_open()
        names = core.validate_keys(keys, self.limits.max_key_bytes)
        deadline = self._deadline()
        out: list[bool] = []
        for span in core.batch_ranges(len(names), self.limits.max_batch_keys):
            chunk = names[span.start:span.stop]
            reply = self._master.call("Exists", pb.KeysRequest(header=self._header, keys=chunk),
                                      deadline)
            core.check_result_count("Exists", len(reply.statuses), len(chunk))
            for key, st in zip(chunk, reply.statuses, strict=True):
                status = core.to_status(st)
                if status not in (Status.OK, Status.NOT_FOUND, Status.NOT_READY):
                    raise core.status_error(status, "", key)
                out.append(status == Status.OK)
        return out

    def prefix_len(self, keys: Sequence[str]) -> int:
        """How many leading keys of `keys` have complete values (never pins)."""
        self._check_open()
        names = core.validate_keys(keys, self.limits.max_key_bytes)
        deadline = self._deadline()
        total = 0
        for span in core.batch_ranges(len(names), self.limits.max_batch_keys):
            chunk = names[span.start:span.stop]
            reply = self._master.call("PrefixLen", pb.KeysRequest(header=self._header, keys=chunk),
                                      deadline)
            n = int(reply.prefix_len)
            if n > len(chunk):
                raise CellarError(f"PrefixLen: master answered {n} for {len(chunk)} keys")
            total += n
            if n < len(chunk):
                break
        return total

    def remove(self, key: str) -> bool:
        """Remove `key`; True if it was there, False if not."""
        self._check_open()
        key = core.validate_key(key, self.limits.max_key_bytes)
        reply = self._master.call("Remove", pb.KeysRequest(header=self._header, keys=[key]),
                                  self._deadline())
        core.check_result_count("Remove", len(reply.results), 1)
        status = core.to_status(reply.results[0].status)
        if status == Status.OK:
            return True
        if status == Status.NOT_FOUND:
            return False
        raise core.status_error(status, reply.results[0].message, key)

    def remove_prefix(self, prefix: str) -> int:
        """Remove every key of this tenant that starts with `prefix` (non-empty); the count."""
        self._check_open()
        prefix = core.validate_key(prefix, self.limits.max_key_bytes, "prefix")
        reply = self._master.call(
            "RemovePrefix", pb.RemovePrefixRequest(header=self._header, prefix=prefix),
            self._deadline())
        return int(reply.removed)

    def status(self) -> dict[str, Any]:
        """A cluster summary: capacity, use, objects, segments, nodes, tenants, limits."""
        self._check_open()
        reply = self._master.call("ClusterStatus", pb.ClusterStatusRequest(header=self._header),
                                  self._deadline())
        self.limits = Limits.from_status(reply)
        return core.status_to_dict(reply)

    # ---- plumbing --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise CellarError("this cellar.Client is closed")

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout_s

    def _transfer(self, kind: str, ops: list[TransferOp], deadline: float,
                  can_fall_back: bool) -> list[TransferResult]:
        """Move `ops` through the transports that reach them; one result per op, in order."""
        if not ops:
            return []
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise Timeout(f"{kind} of {len(ops)} ranges: the {self.timeout_s:g}s deadline passed")
        round_deadline = time.monotonic() + core.attempt_budget_s(remaining_s, can_fall_back)
        results: list[TransferResult | None] = [None] * len(ops)
        groups, unreachable = self._transports.assign(ops)
        for i in unreachable:
            results[i] = TransferResult(ST_CONNECT_FAILED, "no transport reaches node "
                                        f"{ops[i].route.node_id}")
        for transport, indexes in groups:
            sub = [ops[i] for i in indexes]
            move = transport.write if kind == "write" else transport.read
            budget_s = round_deadline - time.monotonic()
            if budget_s <= 0:
                sub_results = [TransferResult(ST_TIMEOUT, "no time left")] * len(sub)
            else:
                try:
                    sub_results = move(sub, budget_s)
                except OSError as exc:
                    sub_results = [TransferResult(ST_CONNECTION_LOST, str(exc))] * len(sub)
            core.check_result_count(f"{transport.name} {kind}", len(sub_results), len(sub))
            for i, res in zip(indexes, sub_results, strict=True):
                results[i] = res
                if res.status in core.NODE_TROUBLE:
                    transport.forget(ops[i].route)
        return [r if r is not None else TransferResult(ST_CONNECTION_LOST, "no result")
                for r in results]


def connect(address: str, *, tenant: str = "default", token: str | None = None,
            timeout_s: float = 30.0, transport: str = "auto") -> Client:
    """Connect to a Cellar cluster: its master's "host:port", or
    "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER" for a highly available cluster, whose leader is
    looked up in etcd (waiting up to `timeout_s` while an election runs) and followed when it
    changes. Given a "host:port", the client follows the redirects of a standby master.

    `tenant` names the key namespace (and quota); `token` is the credential when the master
    checks one; `timeout_s` bounds every call; `transport` picks the data plane ("auto" chooses
    per replica: "shm" for same-host nodes, "rdma" where a device exists, else "tcp"; a forced
    name uses only that transport). Raises `cellar.Unavailable` if the master (or, for an etcd
    address, etcd or a leader) cannot be reached within `timeout_s`, `cellar.InvalidArgument`
    for bad arguments (a malformed address included) (and for a forced transport
    this machine lacks, e.g. "rdma" without a device).
    """
    return Client(address, tenant=tenant, token=token, timeout_s=timeout_s, transport=transport)


def probe_master(address: str, *, tenant: str = "default", token: str | None = None,
                 timeout_s: float = 5.0) -> dict[str, Any]:
    """One master's own ClusterStatus, not following any redirect: its role ("leader",
    "standby", "single"), epoch and leader_address, plus (when it serves) the summary
    `Client.status` gives. `address` is "host:port"; `cellar.Unavailable` if it is down."""
    if parse_master_address(address) is not None:
        raise InvalidArgument(f"probe_master takes one master's 'host:port', not {address!r}")
    timeout_s = core.validate_timeout(timeout_s)
    header = pb.RequestHeader(tenant=core.validate_tenant(tenant), client_id=_client_id(),
                              token=token if token is not None else default_token(address) or "")
    channel = MasterChannel(address, fast=False, follow=False)
    try:
        reply = channel.call("ClusterStatus", pb.ClusterStatusRequest(header=header),
                             time.monotonic() + timeout_s)
    finally:
        channel.close()
    return core.status_to_dict(reply)
