"""`AsyncClient`: the asyncio face of the SDK, method for method the same as `Client`.

What it owns
    The asyncio I/O the flows ask for (`cellar.client.flows`): `Rpc` through
    `AsyncMasterChannel` (grpc.aio + the asyncio fast line), `Move` through the asyncio
    transports of `cellar.transfer` (`AsyncTransport`: the loop's own sockets for tcp, inline
    copies for shm; no thread carries payload), `Sleep` as `asyncio.sleep`; and a loop task that
    releases pins no GetReplicas carried within `UNPIN_DELAY_S` (client/aio_unpins.py). What is sent, retried and
    returned is decided by the same flows as the sync face (`cellar.client.operations`), so the
    arguments, results and exceptions are the same; only `await` differs.

One loop
    An `AsyncClient` belongs to the event loop that opened it (its sockets and channel are that
    loop's); a call from another loop raises `cellar.InvalidArgument`. Any number of calls may
    run concurrently on its loop: per-call state lives in the call's own flow.

Cancellation
    A cancelled call stops where it is: the transports guarantee that no byte of a read they
    gave up on lands in the caller's buffer afterwards, its pins are queued for release (also
    those of a GetReplicas still with the master: client/aio_unpins.py `lookup`), and a
    put in flight is revoked (best effort; the master's writer timeout does it otherwise).

Coalesced gets
    The `get` calls made in one turn of the loop travel as one batch (client/aio_gets.py).

Deadlines and leader changes
    As for `Client`: `timeout_s` bounds each call; the channel follows the leader.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from cellar.client import buffer_operations, flows, metrics, one_put, one_read, operations
from cellar.client.aio_gets import CoalescedGets
from cellar.client.aio_rpc import AsyncMasterChannel
from cellar.client.aio_unpins import AsyncUnpins
from cellar.client.checks import (
    CLOSE_FLUSH_MAX_CALLS,
    CLOSE_FLUSH_TIMEOUT_S,
    DEFAULT_MAX_LIST_KEYS,
    Limits,
    validate_key,
    validate_nbytes,
    validate_tokens_per_key,
)
from cellar.client.connect_args import ConnectArgs, opened
from cellar.client.early_reads import Locations, early_reads_from_env, trusted_reads_from_env
from cellar.client.flow_run import FlowRun
from cellar.client.flows import Move, Rpc, RpcAndMove, Session, Sleep
from cellar.client.load_costs import LoadEstimate
from cellar.client.lookup import LookupResult, lookup_flow
from cellar.client.one_put import OnePut
from cellar.client.one_read import OneRead
from cellar.client.put_ahead import PutAheadPool, put_ahead_from_env
from cellar.client.puts import PutHints
from cellar.client.session_state import TransportSet
from cellar.client.statuses import ClientClosed
from cellar.errors import CellarError, InvalidArgument, Status
from cellar.proto import cellar_pb2 as pb
from cellar.transfer import open_async_transports
from cellar.transfer.base import ST_CONNECTION_LOST, TransferResult

T = TypeVar("T")

__all__ = ["AsyncClient", "connect_async"]


class AsyncClient:
    """A connection to one Cellar cluster for one tenant, for asyncio code.

    `client = await cellar.connect_async(address, ...)` or `async with
    cellar.AsyncClient(address, ...) as client:`; every method of `cellar.Client` is here as a
    coroutine with the same arguments, results and exceptions.
    """

    def __init__(self, address: str, *, tenant: str = "default", token: str | None = None,
                 timeout_s: float = 30.0, transport: str = "auto") -> None:
        self._args = ConnectArgs.check(address, tenant, token, timeout_s, transport)
        self.address = self._args.address
        self.tenant = self._args.tenant
        self.timeout_s = self._args.timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._discovery: Any = None
        self._master: AsyncMasterChannel | None = None
        self._transports = TransportSet([])
        self._s: Session | None = None
        self._tokens_per_key: int | None = None
        self._unpins: AsyncUnpins | None = None  # pin releases no GetReplicas carried
        self._gets: CoalescedGets | None = None  # client/aio_gets.py, made with the session

    async def open(self) -> AsyncClient:
        """Connect (ClusterStatus at the leader); called by `connect_async` and `async with`."""
        if self._closed:
            raise ClientClosed("this cellar.AsyncClient is closed")
        if self._loop is not None:
            self._check_loop()
            return self
        self._loop = asyncio.get_running_loop()
        args = self._args
        deadline = time.monotonic() + self.timeout_s
        master_address = args.address
        resolve = None
        try:
            if args.target is not None:
                from cellar.coord.discovery import LeaderDiscovery

                self._discovery = LeaderDiscovery(args.target)
                record = await asyncio.to_thread(self._discovery.wait_for_leader, self.timeout_s)
                master_address = record.address
                resolve = self._leader_from_etcd
            self._transports = TransportSet(opened(open_async_transports, args.transport, args.address))
            self._master = AsyncMasterChannel(master_address, resolve=resolve)
            self._s = Session(args.tenant, args.header(), args.timeout_s, self._master,
                              self._transports, self._release,
                              tokens_per_key=self._tokens_per_key,
                              locations=Locations(trust=trusted_reads_from_env())
                              if early_reads_from_env() else None,
                              aheads=PutAheadPool(held) if (held := put_ahead_from_env())
                              else None)
            self._unpins = AsyncUnpins(self._loop, self._s, self._master.call)
            self._gets = CoalescedGets(self._loop, self._s, self._run, self._get_one)
            reply = await self._master.call("ClusterStatus",
                                            pb.ClusterStatusRequest(header=self._s.header),
                                            deadline)
        except BaseException:
            await self.aclose()
            raise
        self._s.limits = Limits.from_status(reply)
        return self

    async def _leader_from_etcd(self, timeout_s: float) -> str:
        record = await asyncio.to_thread(self._discovery.leader, timeout_s)
        return record.address if record is not None else ""

    @property
    def master_address(self) -> str:
        """HOST:PORT of the master this client talks to now (the leader it follows)."""
        return self._master.address if self._master is not None else self.address

    @property
    def limits(self) -> Limits:
        return self._s.limits if self._s is not None else Limits()

    @property
    def tokens_per_key(self) -> int | None:
        """As `Client.tokens_per_key` (settable before or after connecting)."""
        return self._s.tokens_per_key if self._s is not None else self._tokens_per_key

    @tokens_per_key.setter
    def tokens_per_key(self, value: int | None) -> None:
        self._tokens_per_key = validate_tokens_per_key(value)
        if self._s is not None:
            self._s.tokens_per_key = self._tokens_per_key

    # ---- context manager and lifecycle -----------------------------------------------------

    async def __aenter__(self) -> AsyncClient:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._s is not None else "not opened")
        return f"<cellar.AsyncClient {self.address} tenant={self.tenant!r} {state}>"

    async def aclose(self) -> None:
        """Release queued pins (best effort), close connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        unpins = self._unpins
        if unpins is not None:
            unpins.stop()
        # Coalesced gets still queued or in flight end now: their callers get ClientClosed.
        pending = [] if self._gets is None else self._gets.close()
        if unpins is not None and unpins.task is not None and not unpins.task.done():
            pending.append(unpins.task)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if unpins is not None:
            await unpins.flush(CLOSE_FLUSH_MAX_CALLS, CLOSE_FLUSH_TIMEOUT_S)
        if self._s is not None and self._master is not None:
            await self._revoke_ahead()
        for transport in self._transports.transports:
            await transport.aclose()
        if self._master is not None:
            await self._master.aclose()
        if self._discovery is not None:
            await asyncio.to_thread(self._discovery.close)

    close = aclose  # `await client.close()` reads like the sync face's `client.close()`

    # ---- put -------------------------------------------------------------------------------

    async def put(self, key: str, value: Any, *, replicas: int = 1, soft_pin: bool = False,
                  hints: PutHints | None = None) -> None:
        """As `Client.put`."""
        await self._put(key, value, replicas=replicas, soft_pin=soft_pin, upsert=False,
                        hints=hints)

    async def upsert(self, key: str, value: Any, *, replicas: int = 1,
                     soft_pin: bool = False, hints: PutHints | None = None) -> None:
        """As `Client.upsert`."""
        await self._put(key, value, replicas=replicas, soft_pin=soft_pin, upsert=True,
                        hints=hints)

    async def _put(self, key: str, value: Any, **how: Any) -> None:
        s = self._session()
        one = operations.one_put(s, key, value, **how)
        if not await self._put_one(s, one):
            await self._run(operations.put(s, key, value, deadline=one_put.deadline_of(one),
                                           **how), "put")

    async def put_many(self, items: Any, *, replicas: int = 1, soft_pin: bool = False,
                       upsert: bool = False, hints: PutHints | None = None) -> list[Status]:
        """As `Client.put_many`."""
        return await self._run(operations.put_many(self._session(), items, replicas=replicas,
                                            soft_pin=soft_pin, upsert=upsert, hints=hints), "put")

    # ---- get -------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes:
        """As `Client.get`. The `get` calls made in one turn of the loop travel together (one
        GetReplicas, one transfer round; see "Coalesced gets" above); each still gets its own
        result or exception. A turn's lone get is made in one step, as `Client.get`'s."""
        s, loop = self._s, self._loop
        # `_session()`'s checks, inlined for the common case (this runs once per caller)
        if s is None or loop is None or self._closed or asyncio.get_running_loop() is not loop:
            s = self._session()  # raises the precise error
            assert loop is not None
        key = validate_key(key, s.limits.max_key_bytes)
        assert self._gets is not None  # made with the session
        return await self._gets.add(key)

    async def get_into(self, key: str, buffer: Any) -> int:
        """As `Client.get_into`."""
        s = self._session()
        one = operations.one_get_into(s, key, buffer)
        got = await self._read_one(s, one)
        if got >= 0:
            return got
        return await self._run(operations.get_into(s, key, buffer, one_read.deadline_of(one)),
                               "get")

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """As `Client.get_many`."""
        return await self._run(operations.get_many(self._session(), keys), "get")

    async def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any], *,
                            timeout_s: float | None = None, prefix: bool = False) -> list[int]:
        """As `Client.get_many_into` (sizes, `cellar.MISS`, `cellar.LATE`; `prefix`)."""
        return await self._run(operations.get_many_into(self._session(), keys, buffers,
                                                 timeout_s=timeout_s, prefix=prefix), "get")

    async def size(self, key: str) -> int:
        """As `Client.size`."""
        return await self._run(operations.size(self._session(), key))

    # ---- probes and removal ----------------------------------------------------------------

    async def exists(self, key: str) -> bool:
        """As `Client.exists`."""
        return await self._run(operations.exists(self._session(), key), "exists")

    async def exists_many(self, keys: Sequence[str]) -> list[bool]:
        """As `Client.exists_many`."""
        return await self._run(operations.exists_many(self._session(), keys), "exists")

    async def prefix_len(self, keys: Sequence[str]) -> int:
        """As `Client.prefix_len`."""
        return await self._run(operations.prefix_len(self._session(), keys), "prefix_len")

    async def lookup(self, keys: Sequence[str], *, prefill_tokens_per_s: float | None = None,
                     tokens_per_key: int | None = None) -> LookupResult:
        """As `Client.lookup`."""
        return await self._run(lookup_flow(self._session(), keys, prefill_tokens_per_s,
                                           tokens_per_key), "lookup")

    async def load_estimate(self, nbytes: int) -> LoadEstimate:
        """As `Client.load_estimate` (no I/O; a coroutine like every method of this face)."""
        return self._session().costs.estimate(validate_nbytes(nbytes))

    async def remove(self, key: str) -> bool:
        """As `Client.remove`."""
        return await self._run(operations.remove(self._session(), key))

    async def remove_many(self, keys: Sequence[str]) -> list[bool]:
        """As `Client.remove_many`."""
        return await self._run(operations.remove_many(self._session(), keys))

    async def remove_prefix(self, prefix: str) -> int:
        """As `Client.remove_prefix`."""
        return await self._run(operations.remove_prefix(self._session(), prefix))

    async def remove_all(self, *, tenant: str | None = None) -> int:
        """As `Client.remove_all`."""
        return await self._run(operations.remove_all(self._session(), tenant))

    async def list_keys(self, prefix: str = "", *, start_after: str = "",
                        limit: int = DEFAULT_MAX_LIST_KEYS) -> list[str]:
        """As `Client.list_keys`."""
        return await self._run(operations.list_keys(self._session(), prefix, start_after, limit))

    async def list_all_keys(self, prefix: str = "", *,
                            page_keys: int = DEFAULT_MAX_LIST_KEYS) -> list[str]:
        """As `Client.list_all_keys`."""
        return await self._run(operations.list_all_keys(self._session(), prefix, page_keys))

    async def status(self) -> dict[str, Any]:
        """As `Client.status`."""
        return await self._run(operations.status(self._session()))

    # ---- registered memory, parts, tensors (cellar.client.buffer_operations) ---------------------

    async def register_buffer(self, ptr: int, size: int) -> None:
        """As `Client.register_buffer`."""
        self._session().pointers.register(ptr, size)

    async def unregister_buffer(self, ptr: int) -> None:
        """As `Client.unregister_buffer`."""
        self._session().pointers.unregister(ptr)

    async def put_from(self, key: str, ptr: int, size: int, *, replicas: int = 1,
                       soft_pin: bool = False, upsert: bool = False) -> None:
        """As `Client.put_from`."""
        s = self._session()
        one = buffer_operations.one_put_from(s, key, ptr, size, replicas=replicas,
                                             soft_pin=soft_pin, upsert=upsert)
        if not await self._put_one(s, one):
            await self._run(buffer_operations.put_from(s, key, ptr, size, replicas=replicas,
                                                       soft_pin=soft_pin, upsert=upsert,
                                                       deadline=one_put.deadline_of(one)), "put")

    async def put_many_from(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int], *,
                            replicas: int = 1, soft_pin: bool = False,
                            upsert: bool = False) -> list[Status]:
        """As `Client.put_many_from`."""
        return await self._run(buffer_operations.put_many_from(self._session(), keys, ptrs, sizes,
                                                         replicas=replicas, soft_pin=soft_pin,
                                                         upsert=upsert), "put")

    async def get_into_ptr(self, key: str, ptr: int, size: int) -> int:
        """As `Client.get_into_ptr`."""
        s = self._session()
        one = buffer_operations.one_get_into_ptr(s, key, ptr, size)
        got = await self._read_one(s, one)
        if got >= 0:
            return got
        return await self._run(buffer_operations.get_into_ptr(s, key, ptr, size,
                                                              one_read.deadline_of(one)), "get")

    async def get_many_into_ptrs(self, keys: Sequence[str], ptrs: Sequence[int],
                                 sizes: Sequence[int], *, timeout_s: float | None = None,
                                 prefix: bool = False) -> list[int]:
        """As `Client.get_many_into_ptrs`."""
        return await self._run(buffer_operations.get_many_into_ptrs(self._session(), keys, ptrs, sizes,
                                                              timeout_s=timeout_s, prefix=prefix),
                                                              "get")

    async def put_parts(self, key: str, parts: Sequence[Any], *, replicas: int = 1,
                        soft_pin: bool = False, upsert: bool = False,
                        hints: PutHints | None = None) -> None:
        """As `Client.put_parts`."""
        await self._run(buffer_operations.put_parts(self._session(), key, parts, replicas=replicas,
                                              soft_pin=soft_pin, upsert=upsert, hints=hints), "put")

    async def put_many_parts(self, items: Sequence[tuple[str, Sequence[Any]]], *, replicas: int = 1,
                             soft_pin: bool = False, upsert: bool = False,
                             hints: PutHints | None = None) -> list[Status]:
        """As `Client.put_many_parts`."""
        return await self._run(buffer_operations.put_many_parts(self._session(), items, replicas=replicas,
                                                          soft_pin=soft_pin, upsert=upsert,
                                                          hints=hints), "put")

    async def get_into_parts(self, key: str, parts: Sequence[Any]) -> int:
        """As `Client.get_into_parts`."""
        return await self._run(buffer_operations.get_into_parts(self._session(), key, parts), "get")

    async def get_many_into_parts(self, keys: Sequence[str], parts_per_key: Sequence[Sequence[Any]],
                                  *, timeout_s: float | None = None,
                                  prefix: bool = False) -> list[int]:
        """As `Client.get_many_into_parts`."""
        return await self._run(buffer_operations.get_many_into_parts(self._session(), keys, parts_per_key,
                                                               timeout_s=timeout_s, prefix=prefix),
                                                               "get")

    async def put_tensor(self, key: str, t: Any, *, replicas: int = 1, soft_pin: bool = False,
                         upsert: bool = False) -> None:
        """As `Client.put_tensor`."""
        await self._run(buffer_operations.put_tensor(self._session(), key, t, replicas=replicas,
                                               soft_pin=soft_pin, upsert=upsert), "put")

    async def put_tensors(self, keys: Sequence[str], tensors: Sequence[Any], *, replicas: int = 1,
                          soft_pin: bool = False, upsert: bool = False) -> list[Status]:
        """As `Client.put_tensors`."""
        return await self._run(buffer_operations.put_tensors(self._session(), keys, tensors,
                                                       replicas=replicas, soft_pin=soft_pin,
                                                       upsert=upsert), "put")

    async def get_tensor(self, key: str) -> Any:
        """As `Client.get_tensor`."""
        return await self._run(buffer_operations.get_tensor(self._session(), key), "get")

    async def get_tensors(self, keys: Sequence[str]) -> list[Any]:
        """As `Client.get_tensors`."""
        return await self._run(buffer_operations.get_tensors(self._session(), keys), "get")

    async def get_tensor_into(self, key: str, t: Any) -> int:
        """As `Client.get_tensor_into`."""
        return await self._run(buffer_operations.get_tensor_into(self._session(), key, t), "get")

    # ---- the face: performing what the flows ask -------------------------------------------

    def _session(self) -> Session:
        if self._closed:
            raise ClientClosed("this cellar.AsyncClient is closed")
        if self._s is None:
            raise ClientClosed("this cellar.AsyncClient is not open: use "
                               "`await cellar.connect_async(...)` or `async with`")
        self._check_loop()
        return self._s

    def _check_loop(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise InvalidArgument("this cellar.AsyncClient belongs to another event loop; "
                                  "open one client per loop")

    async def _run(self, flow: Generator[flows.Effect, Any, T], op: str | None = None) -> T:
        """Perform what `flow` asks until it returns; `op` names the metric family it counts in."""
        run = FlowRun(flow, op, self._s.costs if self._s is not None else None)
        while (effect := run.next()) is not None:
            started = time.perf_counter()
            try:
                run.answer(await self._perform(effect), started)
            except BaseException as exc:  # noqa: BLE001 - handed to the flow, which re-raises
                run.fail(exc, started)
        return run.result

    async def _get_one(self, key: str) -> tuple[bytes | None, float | None]:
        """A lone coalesced `get` of checked `key` in one step (client/one_read.py): its
        value, or None and the deadline the general flow keeps (`CoalescedGets`)."""
        s = self._session()
        one = operations.one_get(s, key)
        if await self._read_one(s, one) >= 0:
            assert one is not None
            return one_read.value(one), None
        return None, one_read.deadline_of(one)

    async def _read_one(self, s: Session, one: OneRead | None) -> int:
        """As `Client._read_one`."""
        if one is None:
            return -1
        try:
            if one.batch is not None:
                request = one_read.lookup_request(s, one)
                assert self._unpins is not None  # `_session` said the client is open
                try:
                    reply = await self._unpins.lookup(request, one.deadline)
                except BaseException as exc:
                    one_read.lookup_failed(s, one, exc)
                    raise
                if not one_read.on_lookup(s, one, reply):
                    return -1
            started = time.perf_counter()
            try:
                (result,) = await one.transport.read(one.ops(), one.budget_s)
            except OSError as exc:
                result = TransferResult(ST_CONNECTION_LOST, str(exc))
            except BaseException:
                one_read.abandon(s, one)
                raise
            return one_read.finish(s, one, result, started)
        finally:
            one.done()

    async def _put_one(self, s: Session, one: OnePut | None) -> bool:
        """As `Client._put_one`."""
        if one is None:
            return False
        master = self._master
        assert master is not None  # `_session` said the client is open
        try:
            started = time.perf_counter()
            try:
                results = list(await one.transport.write(one.ops, one.budget_s))
            except OSError as exc:
                results = [TransferResult(ST_CONNECTION_LOST, str(exc))] * len(one.ops)
            wrote = time.perf_counter()
            request = one_put.end_request(s, one, results)
            if request is None:
                await self._call_quietly(*one_put.revoke_request(s, one))
                return False
            try:
                reply = await master.call("PutEnd", request, one.deadline)
            except BaseException as exc:
                metrics.record_error("put", exc)
                await self._call_quietly(*one_put.revoke_request(s, one))
                raise
            return one_put.finish(s, one, reply, wrote - started, time.perf_counter() - wrote)
        finally:
            one.done()

    async def _call_quietly(self, method: str, request: Any, deadline: float) -> None:
        """As `Client._call_quietly`."""
        assert self._master is not None
        try:
            await self._master.call(method, request, deadline)
        except (CellarError, ValueError, RuntimeError):
            pass

    async def _perform(self, effect: flows.Effect) -> Any:
        if isinstance(effect, Rpc):
            assert self._master is not None and self._unpins is not None
            if effect.method == "GetReplicas":  # its pins outlive a cancelled caller
                return await self._unpins.lookup(effect.request, effect.deadline)
            return await self._master.call(effect.method, effect.request, effect.deadline)
        if isinstance(effect, Move):
            return await self._move(effect)
        if isinstance(effect, RpcAndMove):
            return await self._rpc_and_move(effect)
        if isinstance(effect, Sleep):
            await asyncio.sleep(effect.seconds)
            return None
        raise AssertionError(f"unknown effect {effect!r}")

    async def _rpc_and_move(self, effect: RpcAndMove) -> tuple[Any, list[TransferResult]]:
        """Both at once; returns (or raises the call's error) only once both ended."""
        assert self._unpins is not None and effect.rpc.method == "GetReplicas"
        return await self._unpins.lookup_beside(effect.rpc.request, effect.rpc.deadline,
                                                self._move(effect.move))

    async def _move(self, effect: Move) -> list[TransferResult]:
        """Every transport's share of the round at once, each by the round's deadline."""
        rnd = effect.round

        async def one(transport: Any, indexes: list[int]) -> list[TransferResult]:
            budget_s = rnd.budget_s()
            if budget_s <= 0:
                return rnd.timed_out(indexes)
            sub = [rnd.ops[i] for i in indexes]
            try:
                move = transport.write if rnd.kind == "write" else transport.read
                return list(await move(sub, budget_s))
            except OSError as exc:
                return [TransferResult(ST_CONNECTION_LOST, str(exc))] * len(sub)

        if len(rnd.groups) == 1:
            transport, indexes = rnd.groups[0]
            rnd.settle(transport, indexes, await one(transport, indexes))
        elif rnd.groups:
            outcomes = await asyncio.gather(*(one(t, ix) for t, ix in rnd.groups))
            for (transport, indexes), results in zip(rnd.groups, outcomes, strict=True):
                rnd.settle(transport, indexes, results)
        return rnd.outcome()

    # ---- pin release -----------------------------------------------------------------------

    def _release(self, pin_ids: list[int]) -> None:
        """Queue pins for release (client/aio_unpins.py); the session calls it."""
        if self._unpins is not None:
            self._unpins.release(pin_ids)

    async def _revoke_ahead(self) -> None:
        assert self._s is not None and self._master is not None
        for effect in flows.hand_back_aheads(self._s, CLOSE_FLUSH_TIMEOUT_S):
            assert isinstance(effect, Rpc)
            await self._call_quietly(effect.method, effect.request, effect.deadline)


async def connect_async(address: str, *, tenant: str = "default", token: str | None = None,
                        timeout_s: float = 30.0, transport: str = "auto") -> AsyncClient:
    """`cellar.connect` for asyncio: an open `AsyncClient` bound to the running loop."""
    return await AsyncClient(address, tenant=tenant, token=token, timeout_s=timeout_s,
                             transport=transport).open()
