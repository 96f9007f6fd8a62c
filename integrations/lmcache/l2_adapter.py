"""Cellar as an L2 adapter of LMCache's multiprocess (MP) mode (LMCache 0.5.6), by configuration.

How LMCache finds it
    MP mode's `StorageManager` builds one adapter per `--l2-adapter <JSON>`; the `plugin` type
    (`lmcache/v1/distributed/l2_adapters/plugin_l2_adapter.py`) imports `module_path`, takes
    `class_name` (a subclass of LMCache's `L2AdapterInterface`), finds the config class
    `<class_name>Config` beside it and builds the adapter from `adapter_params`:

        lmcache server --l1-size-gb 20 --eviction-policy LRU --l2-adapter '{"type": "plugin",
            "module_path": "cellar.integrations.lmcache.l2_adapter",
            "class_name": "CellarL2Adapter",
            "adapter_params": {"master": "127.0.0.1:50051", "tenant": "default"}}'

    No LMCache file changes. The credential comes from `$CELLAR_TOKEN` or the token file
    `cellar up` writes, as for every SDK client.

What one object holds
    One LMCache MP object (one chunk of one object group of one kv rank), byte for byte as it
    lies in LMCache's L1 memory, under `<format namespace>/<chunk hash hex>.r<kv rank>.g<group>`
    (`.s<cache salt>` appended when LMCache gives one). The namespace is a
    `cellar.integrations.kvformat.KVFormat` of the key's model name and the object's layout
    (LMCache's `MemoryLayoutDesc`: every shape and dtype of the object, hence its size), so a
    reader of another model, dtype, shape or chunk size asks for other keys and sees a miss.
    A loaded object whose size is not its L1 buffer's is refused (the SDK refuses a larger one
    before any transfer): that key's load fails, the bytes never count as loaded.

The interface, in Cellar's terms (LMCache's `L2AdapterInterface`, non-blocking)
    - Store: one `put_many` of the objects' own L1 memory (zero-copy) per task; the task
      succeeds when every object is stored or was already there (a cache treats an existing
      key as stored) and reports the bytes moved.
    - Lookup and lock: one `exists_many` per task; the bitmap has a bit per stored key.
      Cellar holds no reader lock outside a read (a pin lives only while a read runs), so the
      "lock" is only the lookup: Cellar may still evict a looked-up object before LMCache loads
      it (approximate LRU; `soft_pin: true` makes stored objects the last to go); that key's
      load then fails, as the interface allows. `submit_unlock` has nothing to release.
    - Load: one deadline-bounded `get_many_into` straight into the L1 `MemoryObj`s
      (zero-copy); a bit per object that landed whole with its size. When the budget
      (`timeout_s`) runs out no byte of the read lands later (the SDK's guarantee), so a
      buffer LMCache takes back is never written after the task completed.
    - Completion: each task's result is kept until LMCache pops or queries it and the
      matching event fd is signalled (three distinct fds, as the interface demands).
    - Listener and usage: stored, accessed (loaded) and deleted keys go to LMCache's
      listeners through the base class, which also keeps the byte counts `get_usage` reports.
      The capacity is reported as unknown (0): Cellar evicts by itself, so LMCache's global
      L2 eviction stays off; `delete` removes keys when LMCache asks (its quota eviction).

Async without blocking LMCache
    The SDK client lives on an event loop thread of its own (`CellarSession`, shared with the
    remote-backend connector): `submit_*` hand a coroutine to that loop and return the task id
    at once; LMCache's two controller threads never wait on Cellar.

Failures
    Nothing escapes into LMCache after construction: a Cellar error, an unreachable master or
    node, a timeout or a refused object completes the task with a failure (store: failed
    result; lookup and load: zero bits) and is logged. An unreachable master is asked again
    after `session.RECONNECT_BACKOFF_S`; meanwhile every task fails at once. A missing or
    malformed setting is refused at creation (`cellar.InvalidArgument`).

What it must never do
    Hand LMCache bytes of another format or size, leave a task without a result, or write into
    an L1 buffer after its load task completed.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.internal_api import L1MemoryDesc, L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.platform import create_event_notifier

import cellar
from cellar.errors import AlreadyExists, InvalidArgument, Status
from cellar.integrations.kvformat import KVFormat
from cellar.integrations.lmcache.session import FAILURES, CellarSession, read_into

log = logging.getLogger(__name__)
T = TypeVar("T")

ADAPTER_NAME = "lmcache-mp"
# Bumped when the object layout above changes: every namespace changes with it.
ADAPTER_VERSION = 1
TARGET_LMCACHE = "0.5.6"
DEFAULT_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 600.0
DEFAULT_CHUNK_SIZE = 256  # LMCache's own default --chunk-size
# Results LMCache has not collected yet are bounded by its own in-flight limits; this bounds the
# formats one adapter remembers (one per model, object group and layout in practice).
MAX_FORMATS = 1024
_STORED = (Status.OK, Status.ALREADY_EXISTS)


class CellarL2AdapterConfig(L2AdapterConfigBase):
    """`adapter_params` of the `plugin` L2 adapter type, found by LMCache's plugin loader.

    master (required; host:port or etcd://host:port/cluster), tenant ("default"),
    transport ("auto": shm on the same host, else tcp; "tcp", "shm", "rdma"),
    timeout_s (5.0: budget of each Cellar call, and of each load task's read),
    chunk_size (256: LMCache's --chunk-size, part of the KV format), replicas (1),
    soft_pin (false: stored objects evicted only in Cellar's second pass when true)."""

    def __init__(self, master: str, *, tenant: str = "default", transport: str = "auto",
                 timeout_s: float = DEFAULT_TIMEOUT_S, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 replicas: int = 1, soft_pin: bool = False) -> None:
        if not isinstance(master, str) or not master:
            raise InvalidArgument("the Cellar L2 adapter needs \"master\" in adapter_params "
                                  "(host:port or etcd://host:port/cluster)")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise InvalidArgument(f"timeout_s must be seconds in (0, {MAX_TIMEOUT_S}], "
                                  f"got {timeout_s!r}")
        for name, value in (("chunk_size", chunk_size), ("replicas", replicas)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")
        self.master, self.tenant, self.transport = master, str(tenant), str(transport)
        self.timeout_s, self.chunk_size = float(timeout_s), chunk_size
        self.replicas, self.soft_pin = replicas, bool(soft_pin)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CellarL2AdapterConfig:
        known = ("master", "tenant", "transport", "timeout_s", "chunk_size", "replicas",
                 "soft_pin")
        unknown = sorted(set(d) - set(known) - {"type"})
        if unknown:
            raise InvalidArgument(f"unknown Cellar L2 adapter setting(s) {unknown}; "
                                  f"known: {list(known)}")
        return cls(d.get("master", ""), **{k: d[k] for k in known[1:] if k in d})

    @classmethod
    def help(cls) -> str:
        return "Cellar L2 adapter adapter_params:\n" + (cls.__doc__ or "")


def object_format(model: str, layout: MemoryLayoutDesc, chunk_size: int) -> KVFormat:
    """The KV format of MP objects of one model and layout."""
    dtypes = [str(d).removeprefix("torch.") for d in layout.dtypes]
    shapes = ";".join("x".join(str(int(n)) for n in s) for s in layout.shapes)
    nbytes = sum(int(s.numel()) * d.itemsize for s, d in zip(layout.shapes, layout.dtypes,
                                                               strict=True))
    return KVFormat(model=model, kv_dtype="+".join(dtypes), layout="lmcache-mp",
                    page_size_tokens=chunk_size, parallel_rule="kv_rank", adapter=ADAPTER_NAME,
                    adapter_version=ADAPTER_VERSION,
                    shape=(("shapes", shapes), ("object_bytes", str(nbytes))))


def object_name(fmt: KVFormat, key: ObjectKey) -> str:
    """The Cellar key of one MP object in its format."""
    salt = f".s{key.cache_salt}" if key.cache_salt else ""
    return fmt.key(f"{key.chunk_hash.hex()}.r{key.kv_rank}.g{key.object_group_id}{salt}")


def _layout_of(obj: MemoryObj) -> MemoryLayoutDesc:
    return MemoryLayoutDesc(shapes=list(obj.get_shapes()), dtypes=list(obj.get_dtypes()))


class CellarL2Adapter(L2AdapterInterface):
    """LMCache MP-mode L2 adapter over a Cellar cluster (see the module docstring)."""

    config_class_name = "CellarL2AdapterConfig"

    def __init__(self, config: CellarL2AdapterConfig | dict[str, Any],
                 l1_memory_desc: L1MemoryDesc | None = None) -> None:
        super().__init__(max_capacity_bytes=0)
        if isinstance(config, dict):
            config = CellarL2AdapterConfig.from_dict(config)
        self.config = config
        self._l1 = l1_memory_desc
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._lock = threading.Lock()  # task ids, results, formats (two controller threads)
        self._ids = itertools.count()
        self._stores: dict[L2TaskId, L2StoreResult] = {}
        self._lookups: dict[L2TaskId, Bitmap] = {}
        self._loads: dict[L2TaskId, Bitmap] = {}
        self._formats: dict[tuple[str, tuple[Any, ...]], KVFormat] = {}
        self._described: set[str] = set()
        self.failed_tasks = 0  # observability (report_status); the outage tests read it
        self.session = CellarSession(config.master, tenant=config.tenant,
                                     timeout_s=config.timeout_s, transport=config.transport,
                                     on_open=self._on_open)
        log.info("Cellar L2 adapter (LMCache %s MP mode): master %s, tenant %s",
                 TARGET_LMCACHE, config.master, config.tenant)

    # ---- formats and names ---------------------------------------------------------------

    def _format(self, model: str, layout: MemoryLayoutDesc) -> KVFormat:
        sig = (model, tuple(tuple(int(n) for n in s) for s in layout.shapes),
               tuple(str(d) for d in layout.dtypes))
        with self._lock:
            fmt = self._formats.get((model, sig))
            if fmt is None:
                fmt = object_format(model, layout, self.config.chunk_size)
                if len(self._formats) < MAX_FORMATS:
                    self._formats[(model, sig)] = fmt
            return fmt

    def _known_formats(self, model: str) -> list[KVFormat]:
        with self._lock:
            return [f for (m, _), f in self._formats.items() if m == model]

    async def _on_open(self, client: cellar.AsyncClient) -> None:
        self._described.clear()  # a new client may face a new cluster
        if self._l1 is not None and self._l1.ptr and self._l1.size > 0:
            # L1 is the memory every transfer uses: vouch for it, so the SDK's pointer and
            # RDMA paths may use it (a lazy L1 registers the part it has mapped).
            size = self._l1.stable_registration_size or self._l1.size
            await client.register_buffer(self._l1.ptr, size)

    async def _describe(self, client: cellar.AsyncClient, fmt: KVFormat) -> None:
        """Store a format's descriptor once, so an operator can tell what a namespace holds."""
        if fmt.namespace() in self._described:
            return
        self._described.add(fmt.namespace())
        try:
            await client.put(fmt.descriptor_key(), fmt.descriptor())
        except AlreadyExists:
            pass

    # ---- tasks ---------------------------------------------------------------------------

    def _task(self, results: dict[L2TaskId, Any], notifier: Any, what: str,
              work: Callable[[cellar.AsyncClient], Awaitable[T]],
              finish: Callable[[T | None], Any]) -> L2TaskId:
        """Run `work` on the session's loop; its outcome (None on failure) goes through
        `finish` into `results` under a new task id, and `notifier` is signalled. Every task
        completes, whatever `work` raises."""
        with self._lock:
            task_id = next(self._ids)

        def done(future: concurrent.futures.Future[T]) -> None:
            value: T | None = None
            try:
                value = future.result()
            except FAILURES as e:
                log.warning("Cellar L2: %s failed: %s", what, e)
            except BaseException as e:  # noqa: BLE001 - a task must complete whatever happened
                log.exception("Cellar L2: %s failed unexpectedly: %s", what, e)
            try:
                result = finish(value)
            except Exception as e:  # noqa: BLE001 - a listener's error must not lose the task
                log.exception("Cellar L2: %s: a listener failed: %s", what, e)
                value, result = None, finish(None)
            if value is None:
                self.failed_tasks += 1
            with self._lock:
                results[task_id] = result
            notifier.notify()

        try:
            future = self.session.submit(work)
        except Exception as e:  # noqa: BLE001 - closed session or loop: the task fails at once
            future = concurrent.futures.Future()
            future.set_exception(e)
        future.add_done_callback(done)
        return task_id

    def submit_store_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        items = list(zip(keys, objects, strict=True))

        def finish(stored: tuple[list[ObjectKey], list[int], bool] | None) -> L2StoreResult:
            if stored is None:
                return L2StoreResult(False, 0)
            new_keys, sizes, complete = stored
            if new_keys:
                self._notify_keys_stored(new_keys, sizes)
            return L2StoreResult(complete, sum(sizes))

        return self._task(self._stores, self._store_efd, f"store of {len(items)} objects",
                          lambda c: self._store(c, items), finish)

    async def _store(self, client: cellar.AsyncClient, items: list[tuple[ObjectKey, MemoryObj]]
                     ) -> tuple[list[ObjectKey], list[int], bool]:
        puts: list[tuple[str, Any]] = []
        for key, obj in items:
            fmt = self._format(key.model_name, _layout_of(obj))
            await self._describe(client, fmt)
            puts.append((object_name(fmt, key), obj.byte_array))
        statuses = await client.put_many(puts, replicas=self.config.replicas,
                                         soft_pin=self.config.soft_pin)
        new_keys = [key for (key, _), s in zip(items, statuses, strict=True) if s == Status.OK]
        sizes = [obj.get_size() for (_, obj), s in zip(items, statuses, strict=True)
                 if s == Status.OK]
        failed = [s for s in statuses if s not in _STORED]
        if failed:
            log.warning("Cellar L2: %d of %d objects not stored (%s)", len(failed), len(items),
                        ", ".join(sorted({s.name for s in failed})))
        return new_keys, sizes, not failed

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._lock:
            done, self._stores = self._stores, {}
        return done

    def submit_lookup_and_lock_task(self, keys: list[ObjectKey],
                                    group_layout_descs: dict[int, MemoryLayoutDesc]) -> L2TaskId:
        # A key of a group without a layout has no format: it is not asked for (a miss).
        asked = [(i, object_name(self._format(k.model_name, group_layout_descs[k.object_group_id]),
                                 k))
                 for i, k in enumerate(keys) if k.object_group_id in group_layout_descs]

        async def lookup(client: cellar.AsyncClient) -> list[int]:
            if not asked:
                return []
            found = await client.exists_many([name for _, name in asked])
            return [i for (i, _), hit in zip(asked, found, strict=True) if hit]

        return self._task(self._lookups, self._lookup_efd, f"lookup of {len(keys)} objects",
                          lookup, lambda hits: _bitmap(len(keys), hits or []))

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        """Nothing to release: a lookup holds nothing in Cellar (module docstring)."""
        return None

    def submit_load_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        names = [object_name(self._format(k.model_name, _layout_of(o)), k)
                 for k, o in zip(keys, objects, strict=True)]
        expected = [o.get_size() for o in objects]

        async def load(client: cellar.AsyncClient) -> list[int]:
            # `byte_array` is a view of the L1 memory that does not keep its MemoryObj alive:
            # made here, while `objects` (held by this closure until the task ends) are.
            return await self._load(client, names, [o.byte_array for o in objects], expected)

        def finish(hits: list[int] | None) -> Bitmap:
            if hits:
                self._notify_keys_accessed([keys[i] for i in hits])
            return _bitmap(len(keys), hits or [])

        return self._task(self._loads, self._load_efd, f"load of {len(keys)} objects", load,
                          finish)

    async def _load(self, client: cellar.AsyncClient, names: list[str], buffers: list[Any],
                    expected: list[int]) -> list[int]:
        sizes = await read_into(client, names, buffers, self.config.timeout_s, prefix=False)
        refused = [n for n, s, e in zip(names, sizes, expected, strict=True) if 0 <= s != e]
        if refused:
            log.warning("Cellar L2: refused %d object(s) of another size, first %s",
                        len(refused), refused[0])
        return [i for i, (s, e) in enumerate(zip(sizes, expected, strict=True)) if s == e]

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._loads.pop(task_id, None)

    # ---- event fds, eviction, status, close -----------------------------------------------

    def get_store_event_fd(self) -> int:
        return int(self._store_efd.fileno())

    def get_lookup_and_lock_event_fd(self) -> int:
        return int(self._lookup_efd.fileno())

    def get_load_event_fd(self) -> int:
        return int(self._load_efd.fileno())

    def delete(self, keys: list[ObjectKey]) -> None:
        """Remove `keys` (under every format this adapter has seen for their model) and tell
        the listeners which were removed. Blocking, bounded by `timeout_s` per call; a
        failure is logged and removes nothing more."""
        targets = [(key, fmt) for key in keys for fmt in self._known_formats(key.model_name)]

        async def remove(client: cellar.AsyncClient) -> list[tuple[ObjectKey, int]]:
            gone = []
            for key, fmt in targets:
                if await client.remove(object_name(fmt, key)):
                    gone.append((key, int(dict(fmt.shape)["object_bytes"])))
            return gone

        try:
            removed = self.session.run_sync(remove) if targets else []
        except FAILURES as e:
            log.warning("Cellar L2: delete of %d objects failed: %s", len(keys), e)
            return
        if removed:
            self._notify_keys_deleted([k for k, _ in removed], [n for _, n in removed])

    def report_status(self) -> dict[str, Any]:
        return {"is_healthy": self.session.healthy(), "type": "CellarL2Adapter",
                "master": self.config.master, "tenant": self.config.tenant,
                "in_flight": self.session.in_flight, "failed_tasks": self.failed_tasks,
                "formats": len(self._formats)}

    def close(self) -> None:
        try:
            self.session.close()
        finally:
            for efd in (self._store_efd, self._lookup_efd, self._load_efd):
                efd.close()


def _bitmap(size: int, hits: Sequence[int]) -> Bitmap:
    bitmap = Bitmap(size)
    for i in hits:
        bitmap.set(i)
    return bitmap


__all__ = ["ADAPTER_VERSION", "CellarL2Adapter", "CellarL2AdapterConfig", "object_format",
           "object_name"]
