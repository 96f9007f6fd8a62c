"""`Client`: the blocking face of the SDK.

What it owns
    The blocking I/O the flows ask for (`cellar.client.flows`: `Rpc` through `MasterChannel`,
    `Move` through the transports, `Sleep`) and the one-step get and put
    (client/one_read.py, client/one_put.py); helper threads that hash put values behind
    PutStart (client/hash_behind.py), and one background thread that releases pins nobody
    else carried to the master within `UNPIN_DELAY_S`. What is sent, retried and returned is
    decided by the flows (`cellar.client.operations`), the same for `AsyncClient`.

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
    the flows re-place puts and re-ask gets the change voided.

Copies
    None on CPython. `put` sends straight from the caller's buffer. `get_into` /
    `get_many_into` receive straight into the caller's buffer (checked for size before any
    transfer). `get` / `get_many` receive straight into the `bytes` objects they return (see
    `buffers.fresh_bytes`; one copy on other interpreters). Fresh memory still costs its page
    faults, so hot loops should reuse `cellar.alloc_buffer` buffers with the `_into` calls.
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Generator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from cellar.client import buffer_operations, flows, metrics, one_put, one_read, operations
from cellar.client.checks import (
    CLOSE_FLUSH_MAX_CALLS,
    CLOSE_FLUSH_TIMEOUT_S,
    DEFAULT_MAX_LIST_KEYS,
    UNPIN_FLUSH_TIMEOUT_S,
    Limits,
    spin_us_from_env,
    validate_nbytes,
    validate_tokens_per_key,
)
from cellar.client.connect_args import ConnectArgs, opened, parse_master_address
from cellar.client.early_reads import Locations, early_reads_from_env, trusted_reads_from_env
from cellar.client.flow_run import FlowRun
from cellar.client.flows import Move, Rpc, RpcAndMove, Session, Sleep
from cellar.client.hash_behind import HashBehind
from cellar.client.load_costs import LoadEstimate
from cellar.client.lookup import LookupResult, lookup_flow
from cellar.client.one_put import OnePut
from cellar.client.one_read import OneRead
from cellar.client.put_ahead import PutAheadPool, put_ahead_from_env
from cellar.client.puts import PutHints
from cellar.client.rpc import MasterChannel, Meanwhile
from cellar.client.session_state import TransportSet
from cellar.client.statuses import ClientClosed
from cellar.client.unpin_flusher import UnpinFlusher
from cellar.errors import CellarError, Status
from cellar.proto import cellar_pb2 as pb
from cellar.transfer import open_transports
from cellar.transfer.base import ST_CONNECTION_LOST, TransferResult
from cellar.transfer.spin_wait import SpinWait

T = TypeVar("T")

__all__ = ["Client", "connect", "parse_master_address"]


class Client:
    """A connection to one Cellar cluster for one tenant. Create it with `cellar.connect`."""

    def __init__(self, address: str, *, tenant: str = "default", token: str | None = None,
                 timeout_s: float = 30.0, transport: str = "auto") -> None:
        args = ConnectArgs.check(address, tenant, token, timeout_s, transport)
        spin_us = spin_us_from_env()  # reply wait window (transfer/spin_wait.py)
        early_reads = early_reads_from_env()  # client/early_reads.py
        ahead_held = put_ahead_from_env()  # client/put_ahead.py
        spin = SpinWait(spin_us) if spin_us else None
        self.address = args.address
        self.tenant = args.tenant
        self.timeout_s = args.timeout_s
        self._closed = False
        self._hash_behind = HashBehind()  # hashes put values behind PutStart
        deadline = time.monotonic() + self.timeout_s
        self._discovery: Any = None
        self._transports = TransportSet(opened(open_transports, args.transport, args.address,
                                               spin))
        master_address = args.address
        if args.target is not None:
            # etcd names the leader; it is also asked again whenever the leader stops serving.
            from cellar.coord.discovery import LeaderDiscovery

            self._discovery = LeaderDiscovery(args.target)
            try:
                master_address = self._discovery.wait_for_leader(self.timeout_s).address
            except BaseException:
                self._discovery.close()
                self._transports.close()
                raise
        self._master = MasterChannel(
            master_address, resolve=None if args.target is None else self._leader_from_etcd,
            spin=spin)
        self._s = Session(args.tenant, args.header(), args.timeout_s, self._master,
                          self._transports, self._release,
                          locations=Locations(trust=trusted_reads_from_env()) if early_reads else None,
                          aheads=PutAheadPool(ahead_held) if ahead_held else None)
        self._flusher = UnpinFlusher(self._s.unpins, self._send_unpins, self._s.unpin_batch)
        self._finalizer = weakref.finalize(self, UnpinFlusher.stop, self._flusher)
        try:
            reply = self._master.call("ClusterStatus",
                                      pb.ClusterStatusRequest(header=self._s.header), deadline)
        except BaseException:
            self.close()
            raise
        self._s.limits = Limits.from_status(reply)

    def _leader_from_etcd(self, timeout_s: float) -> str:
        """The leader's address as etcd knows it now; "" during an election."""
        record = self._discovery.leader(timeout_s)
        return record.address if record is not None else ""

    @property
    def master_address(self) -> str:
        """HOST:PORT of the master this client talks to now (the leader it follows)."""
        return self._master.address

    @property
    def limits(self) -> Limits:
        return self._s.limits

    @property
    def tokens_per_key(self) -> int | None:
        """Tokens one key stands for (a KV page object's tokens), for the token series of
        `cellar.client.metrics` (tokens asked, reused, found but not used); None (the default)
        leaves them out. Set once, as the engine adapters do; `lookup(tokens_per_key=)` wins
        for its own call."""
        return self._s.tokens_per_key

    @tokens_per_key.setter
    def tokens_per_key(self, value: int | None) -> None:
        self._s.tokens_per_key = validate_tokens_per_key(value)

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
        self._revoke_ahead()
        self._transports.close()
        self._hash_behind.close()
        self._master.close()
        if self._discovery is not None:
            self._discovery.close()

    # ---- put -------------------------------------------------------------------------------

    def put(self, key: str, value: Any, *, replicas: int = 1, soft_pin: bool = False,
            hints: PutHints | None = None) -> None:
        """Store `value` under `key`; raises `cellar.AlreadyExists` if the key exists.

        `value` is any C-contiguous buffer (bytes, bytearray, memoryview, numpy array, CPU
        torch tensor, ...) of at least one byte. Every replica is written (in parallel) before
        the object becomes visible; on failure the put is revoked and the error raised.
        `hints` (`cellar.client.PutHints`, every put form takes it): a soft pin that lapses, a
        hard pin, a preferred host for the first replica.
        """
        self._put(key, value, replicas=replicas, soft_pin=soft_pin, upsert=False, hints=hints)

    def upsert(self, key: str, value: Any, *, replicas: int = 1, soft_pin: bool = False,
               hints: PutHints | None = None) -> None:
        """Store `value` under `key`, replacing any existing value."""
        self._put(key, value, replicas=replicas, soft_pin=soft_pin, upsert=True, hints=hints)

    def _put(self, key: str, value: Any, **how: Any) -> None:
        self._check_open()
        one = operations.one_put(self._s, key, value, **how)
        if not self._put_one(one):
            self._run(operations.put(self._s, key, value, deadline=one_put.deadline_of(one),
                                     **how), "put")

    def put_many(self, items: Any, *, replicas: int = 1, soft_pin: bool = False,
                 upsert: bool = False, hints: PutHints | None = None) -> list[Status]:
        """Store many values; one `cellar.Status` per item in input order.

        `items` is a mapping or a sequence of (key, value) pairs (keys unique). A key that
        exists reports `Status.ALREADY_EXISTS` (a cache treats that as success) unless
        `upsert=True` replaces it; keys that could not be written report their status instead
        of raising. Bad arguments raise `cellar.InvalidArgument` before anything is sent.
        """
        return self._run(operations.put_many(self._s, items, replicas=replicas, soft_pin=soft_pin,
                                      upsert=upsert, hints=hints), "put")

    # ---- get -------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """The value under `key`; raises `cellar.NotFound` if there is none."""
        one = operations.one_get(self._s, key)
        if self._read_one(one) >= 0:
            assert one is not None
            return one_read.value(one)
        return self._run(operations.get(self._s, key, one_read.deadline_of(one)), "get")

    def get_into(self, key: str, buffer: Any) -> int:
        """Read the value under `key` into `buffer`; returns its size in bytes.

        Raises `cellar.NotFound`, or `cellar.BufferTooSmall` (before any transfer) when the
        value does not fit. Bytes past the value's size are left untouched.
        """
        one = operations.one_get_into(self._s, key, buffer)
        got = self._read_one(one)
        if got >= 0:
            return got
        return self._run(operations.get_into(self._s, key, buffer, one_read.deadline_of(one)),
                         "get")

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values for `keys` in input order; None for a key that is missing or unreadable
        (not found, still being written, or every replica unreachable). Raises
        `cellar.IntegrityError` if a value is found but no replica passes its checksum."""
        return self._run(operations.get_many(self._s, keys), "get")

    def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any], *,
                      timeout_s: float | None = None, prefix: bool = False) -> list[int]:
        """Read each key into its buffer; per key its size, `cellar.MISS` (-1) or
        `cellar.LATE` (-2: not read within `timeout_s`, a budget in seconds from the call).

        Every buffer is checked before any transfer (`cellar.BufferTooSmall` names the first
        key whose value does not fit). When the call returns, no byte of a read it gave up on
        lands in `buffers` later. `prefix=True` cuts the list to the leading run of keys that
        were read (keys after a miss are not read). `timeout_s=0` returns at once, every key
        LATE; a negative budget is `cellar.InvalidArgument`.
        """
        return self._run(operations.get_many_into(self._s, keys, buffers, timeout_s=timeout_s,
                                           prefix=prefix), "get")

    def size(self, key: str) -> int:
        """The size in bytes of the value under `key`; raises `cellar.NotFound`."""
        return self._run(operations.size(self._s, key))

    # ---- probes and removal ----------------------------------------------------------------

    def exists(self, key: str) -> bool:
        """Whether a complete value is stored under `key` (never pins it)."""
        return self._run(operations.exists(self._s, key), "exists")

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key has a complete value, in input order (never pins)."""
        return self._run(operations.exists_many(self._s, keys), "exists")

    def prefix_len(self, keys: Sequence[str]) -> int:
        """How many leading keys of `keys` have complete values (never pins)."""
        return self._run(operations.prefix_len(self._s, keys), "prefix_len")

    def lookup(self, keys: Sequence[str], *, prefill_tokens_per_s: float | None = None,
               tokens_per_key: int | None = None) -> LookupResult:
        """What the cache holds of `keys` (ordered page keys): the leading run stored and
        readable, per tier, its bytes, this client's estimated load time, and, given a prefill
        rate and tokens per key, `advice` = "load" | "recompute" (docs/lookup.md). One round
        trip per max_batch_keys keys; never pins."""
        return self._run(lookup_flow(self._s, keys, prefill_tokens_per_s, tokens_per_key),
                         "lookup")

    def load_estimate(self, nbytes: int) -> LoadEstimate:
        """This client's estimate of loading `nbytes` payload bytes (what `lookup` reports as
        `load_s`, from its own measured round trips and reads; no I/O): for a caller that
        sizes a wait, e.g. an engine's prefetch timeout (docs/lookup.md)."""
        return self._s.costs.estimate(validate_nbytes(nbytes))

    def remove(self, key: str) -> bool:
        """Remove `key`; True if it was there, False if not."""
        return self._run(operations.remove(self._s, key))

    def remove_many(self, keys: Sequence[str]) -> list[bool]:
        """Remove `keys` (batched); per key True if it was there, False if not."""
        return self._run(operations.remove_many(self._s, keys))

    def remove_prefix(self, prefix: str) -> int:
        """Remove every key of this tenant that starts with `prefix` (non-empty); the count."""
        return self._run(operations.remove_prefix(self._s, prefix))

    def remove_all(self, *, tenant: str | None = None) -> int:
        """Remove every key of this client's tenant (or of `tenant`: an admin token only,
        else PermissionDenied); the count removed."""
        return self._run(operations.remove_all(self._s, tenant))

    def list_keys(self, prefix: str = "", *, start_after: str = "",
                  limit: int = DEFAULT_MAX_LIST_KEYS) -> list[str]:
        """One page of this tenant's keys that exist (complete values), start with `prefix`
        and sort strictly after `start_after`, ascending in str order, at most `limit`
        (1..the cluster's max_list_keys, else InvalidArgument; the default 1000 is the
        master's default max_list_keys). A page shorter than `limit` is the last; pass a
        page's last key as `start_after` for the next."""
        return self._run(operations.list_keys(self._s, prefix, start_after, limit))

    def list_all_keys(self, prefix: str = "", *, page_keys: int = DEFAULT_MAX_LIST_KEYS) -> list[str]:
        """Every key `list_keys` would page through, ascending, asked `page_keys` (>= 1; at
        most the cluster's max_list_keys are asked at a time) per call; InvalidArgument past
        `MAX_LIST_ALL_KEYS` (1,000,000 keys; page with `list_keys` then). Not a snapshot: a key
        put or removed during the walk may or may not be listed; the others are, once each."""
        return self._run(operations.list_all_keys(self._s, prefix, page_keys))

    def status(self) -> dict[str, Any]:
        """A cluster summary: capacity, use, objects, segments, nodes, tenants, limits, and
        `tiers`: per tier ("dram", "disk") its capacity, use, objects, segments, hits and bytes
        read and written, the disk row with the moves (docs/disk-tier.md)."""
        return self._run(operations.status(self._s))

    # ---- registered memory, parts, tensors (cellar.client.buffer_operations) ---------------------

    def register_buffer(self, ptr: int, size: int) -> None:
        """Vouch for host memory [ptr, ptr + size) the `_ptr`/`_from` calls may use. Overlapping
        registrations count as their union; the same one twice is a no-op."""
        self._check_open()
        self._s.pointers.register(ptr, size)

    def unregister_buffer(self, ptr: int) -> None:
        """Forget the registration starting at `ptr`; `cellar.InvalidArgument` if there is none
        (or a call is using it)."""
        self._check_open()
        self._s.pointers.unregister(ptr)

    def put_from(self, key: str, ptr: int, size: int, *, replicas: int = 1, soft_pin: bool = False,
                 upsert: bool = False) -> None:
        """Store the `size` bytes at `ptr` (inside a registered buffer) under `key`."""
        self._check_open()
        one = buffer_operations.one_put_from(self._s, key, ptr, size, replicas=replicas,
                                             soft_pin=soft_pin, upsert=upsert)
        if not self._put_one(one):
            self._run(buffer_operations.put_from(self._s, key, ptr, size, replicas=replicas,
                                                 soft_pin=soft_pin, upsert=upsert,
                                                 deadline=one_put.deadline_of(one)), "put")

    def put_many_from(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int], *,
                      replicas: int = 1, soft_pin: bool = False,
                      upsert: bool = False) -> list[Status]:
        """`put_many` from registered memory; one `cellar.Status` per key."""
        return self._run(buffer_operations.put_many_from(self._s, keys, ptrs, sizes, replicas=replicas,
                                                   soft_pin=soft_pin, upsert=upsert), "put")

    def get_into_ptr(self, key: str, ptr: int, size: int) -> int:
        """`get_into` the registered memory [ptr, ptr + size); returns the object's size."""
        one = buffer_operations.one_get_into_ptr(self._s, key, ptr, size)
        got = self._read_one(one)
        if got >= 0:
            return got
        return self._run(buffer_operations.get_into_ptr(self._s, key, ptr, size,
                                                        one_read.deadline_of(one)), "get")

    def get_many_into_ptrs(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int], *,
                           timeout_s: float | None = None, prefix: bool = False) -> list[int]:
        """`get_many_into` registered memory (sizes, MISS, LATE; `timeout_s`, `prefix`)."""
        return self._run(buffer_operations.get_many_into_ptrs(self._s, keys, ptrs, sizes,
                                                        timeout_s=timeout_s, prefix=prefix), "get")

    def put_parts(self, key: str, parts: Sequence[Any], *, replicas: int = 1,
                  soft_pin: bool = False, upsert: bool = False,
                  hints: PutHints | None = None) -> None:
        """Store the concatenation of `parts` (in order, no staging copy) under `key`."""
        self._run(buffer_operations.put_parts(self._s, key, parts, replicas=replicas, soft_pin=soft_pin,
                                        upsert=upsert, hints=hints), "put")

    def put_many_parts(self, items: Sequence[tuple[str, Sequence[Any]]], *, replicas: int = 1,
                       soft_pin: bool = False, upsert: bool = False,
                       hints: PutHints | None = None) -> list[Status]:
        """`put_parts` for many (key, parts) pairs; one `cellar.Status` per key."""
        return self._run(buffer_operations.put_many_parts(self._s, items, replicas=replicas,
                                                    soft_pin=soft_pin, upsert=upsert,
                                                    hints=hints), "put")

    def get_into_parts(self, key: str, parts: Sequence[Any]) -> int:
        """Read `key` into `parts` in order; their total must equal the object's size."""
        return self._run(buffer_operations.get_into_parts(self._s, key, parts), "get")

    def get_many_into_parts(self, keys: Sequence[str], parts_per_key: Sequence[Sequence[Any]], *,
                            timeout_s: float | None = None, prefix: bool = False) -> list[int]:
        """`get_many_into` with parts per key (sizes, MISS, LATE; `timeout_s`, `prefix`)."""
        return self._run(buffer_operations.get_many_into_parts(self._s, keys, parts_per_key,
                                                         timeout_s=timeout_s, prefix=prefix), "get")

    def put_tensor(self, key: str, t: Any, *, replicas: int = 1, soft_pin: bool = False,
                   upsert: bool = False) -> None:
        """Store a contiguous tensor with its dtype and shape (torch optional)."""
        self._run(buffer_operations.put_tensor(self._s, key, t, replicas=replicas, soft_pin=soft_pin,
                                         upsert=upsert), "put")

    def put_tensors(self, keys: Sequence[str], tensors: Sequence[Any], *, replicas: int = 1,
                    soft_pin: bool = False, upsert: bool = False) -> list[Status]:
        """`put_tensor` for many; one `cellar.Status` per key."""
        return self._run(buffer_operations.put_tensors(self._s, keys, tensors, replicas=replicas,
                                                 soft_pin=soft_pin, upsert=upsert), "put")

    def get_tensor(self, key: str) -> Any:
        """The tensor stored under `key` (dtype and shape as put); `cellar.NotFound` if none."""
        return self._run(buffer_operations.get_tensor(self._s, key), "get")

    def get_tensors(self, keys: Sequence[str]) -> list[Any]:
        """Tensors for `keys` in order; None for a miss."""
        return self._run(buffer_operations.get_tensors(self._s, keys), "get")

    def get_tensor_into(self, key: str, t: Any) -> int:
        """Read the tensor under `key` into `t` (same dtype and shape, CPU, contiguous)."""
        return self._run(buffer_operations.get_tensor_into(self._s, key, t), "get")

    # ---- the face: performing what the flows ask -------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("this cellar.Client is closed")

    def _run(self, flow: Generator[flows.Effect, Any, T], op: str | None = None) -> T:
        """Perform what `flow` asks until it returns; `op` names the metric family it counts in."""
        if self._closed:
            flow.close()
            raise ClientClosed("this cellar.Client is closed")
        run = FlowRun(flow, op, self._s.costs)
        while (effect := run.next()) is not None:
            started = time.perf_counter()
            try:
                run.answer(self._perform(effect), started)
            except BaseException as exc:  # noqa: BLE001 - handed to the flow, which re-raises
                run.fail(exc, started)
        return run.result

    def _read_one(self, one: OneRead | None) -> int:
        """A one-key get made in one step (client/one_read.py: a trusted read, or a lookup and
        a read): its size, or -1 when the general flow must answer the call."""
        if one is None:
            return -1
        try:
            self._check_open()  # (else `_run` says so)
            if one.batch is not None:
                request = one_read.lookup_request(self._s, one)
                try:
                    reply = self._master.call("GetReplicas", request, one.deadline)
                except BaseException as exc:
                    one_read.lookup_failed(self._s, one, exc)
                    raise
                if not one_read.on_lookup(self._s, one, reply):
                    return -1
            started = time.perf_counter()
            try:
                (result,) = one.transport.read(one.ops(), one.budget_s)
            except OSError as exc:
                result = TransferResult(ST_CONNECTION_LOST, str(exc))
            except BaseException:
                one_read.abandon(self._s, one)
                raise
            return one_read.finish(self._s, one, result, started)
        finally:
            one.done()

    def _put_one(self, one: OnePut | None) -> bool:
        """A one-key put made as one write and one PutEnd (client/one_put.py): True once it
        is done (or raised its error), False when the general flow must answer the call."""
        if one is None:
            return False
        try:
            started = time.perf_counter()
            try:
                results = one.transport.write(one.ops, one.budget_s)
            except OSError as exc:
                results = [TransferResult(ST_CONNECTION_LOST, str(exc))] * len(one.ops)
            wrote = time.perf_counter()
            request = one_put.end_request(self._s, one, results)
            if request is None:
                self._call_quietly(*one_put.revoke_request(self._s, one))
                return False
            try:
                reply = self._master.call("PutEnd", request, one.deadline)
            except BaseException as exc:
                metrics.record_error("put", exc)
                self._call_quietly(*one_put.revoke_request(self._s, one))
                raise
            return one_put.finish(self._s, one, reply, wrote - started,
                                  time.perf_counter() - wrote)
        finally:
            one.done()

    def _call_quietly(self, method: str, request: Any, deadline: float) -> None:
        """A best-effort call (a revoke): the master's own timeouts cover its loss."""
        try:
            self._master.call(method, request, deadline)
        except (CellarError, ValueError, RuntimeError):
            pass

    def _perform(self, effect: flows.Effect) -> Any:
        if isinstance(effect, Rpc):
            if effect.hash_behind:  # PutStart: its values are hashed meanwhile
                return self._hash_behind.around(effect.hash_behind, lambda: self._master.call(
                    effect.method, effect.request, effect.deadline))
            return self._master.call(effect.method, effect.request, effect.deadline)
        if isinstance(effect, Move):
            return self._move(effect)
        if isinstance(effect, RpcAndMove):
            return self._rpc_and_move(effect)
        if isinstance(effect, Sleep):
            time.sleep(effect.seconds)
            return None
        raise AssertionError(f"unknown effect {effect!r}")

    def _rpc_and_move(self, effect: RpcAndMove) -> tuple[Any, list[TransferResult]]:
        """The move runs while the master works on the call: between the fast line's request
        and its reply (or before a gRPC call); exactly once either way."""
        meanwhile = Meanwhile(lambda: self._move(effect.move))
        rpc = effect.rpc
        reply = self._master.call(rpc.method, rpc.request, rpc.deadline, meanwhile=meanwhile)
        return reply, meanwhile.outcome()

    def _move(self, effect: Move) -> list[TransferResult]:
        """Each transport's share of the round in turn (each moves its ops in parallel)."""
        rnd = effect.round
        for transport, indexes in rnd.groups:
            sub = [rnd.ops[i] for i in indexes]
            budget_s = rnd.budget_s()
            if budget_s <= 0:
                results = rnd.timed_out(indexes)
            else:
                try:
                    move = transport.write if rnd.kind == "write" else transport.read
                    results = move(sub, budget_s)
                except OSError as exc:
                    results = [TransferResult(ST_CONNECTION_LOST, str(exc))] * len(sub)
            rnd.settle(transport, indexes, results)
        return rnd.outcome()

    def _release(self, pin_ids: list[int]) -> None:
        if not pin_ids:
            return
        if self._s.unpins.add(pin_ids) or self._closed:
            self._flusher.flush(max_calls=CLOSE_FLUSH_MAX_CALLS)
        else:
            self._flusher.ensure_started()

    def _revoke_ahead(self) -> None:
        for effect in flows.hand_back_aheads(self._s, CLOSE_FLUSH_TIMEOUT_S):
            assert isinstance(effect, Rpc)
            self._call_quietly(effect.method, effect.request, effect.deadline)

    def _send_unpins(self, ids: list[int]) -> None:
        timeout_s = CLOSE_FLUSH_TIMEOUT_S if self._closed else UNPIN_FLUSH_TIMEOUT_S
        flow = flows.unpin(self._s, ids, timeout_s)
        effect = next(flow)
        assert isinstance(effect, Rpc)
        self._master.call(effect.method, effect.request, effect.deadline)


def connect(address: str, *, tenant: str = "default", token: str | None = None,
            timeout_s: float = 30.0, transport: str = "auto") -> Client:
    """Connect to a Cellar cluster: its master's "host:port", or
    "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER" for a highly available cluster, whose leader is
    looked up in etcd (waiting up to `timeout_s` while an election runs) and followed when it
    changes. Given a "host:port", the client follows the redirects of a standby master.

    `tenant` names the key namespace (and quota); `token` is the credential (None: take
    $CELLAR_TOKEN, else the token file `cellar up` wrote); `timeout_s` bounds every call;
    `transport` picks the data plane ("auto" chooses per replica: "shm" for same-host nodes,
    "rdma" where a device exists, else "tcp"; a forced name uses only that transport). Raises
    `cellar.Unavailable` if the master (or, for an etcd address, etcd or a leader) cannot be
    reached within `timeout_s`, `cellar.InvalidArgument` for bad arguments (a malformed
    address, a forced transport this machine lacks), `cellar.Unauthenticated` /
    `cellar.PermissionDenied` when the master refuses the credential.
    """
    return Client(address, tenant=tenant, token=token, timeout_s=timeout_s, transport=transport)
