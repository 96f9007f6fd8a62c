"""Cellar as an LMCache remote storage plugin (LMCache 0.5.6), loaded by configuration only.

How LMCache finds it
    LMCache 0.5.6 builds one `RemoteBackend` per name in `remote_storage_plugins`; its
    `ConnectorManager` imports `extra_config["remote_storage_plugin.<name>.module_path"]`, takes
    the attribute named by `...class_name` and, because `CellarConnectorAdapter` subclasses
    LMCache's `ConnectorAdapter`, instantiates it with no argument and asks it to
    `create_connector(context)` for the URL `plugin://<name>`. No LMCache file changes:

        remote_storage_plugins: ["cellar"]
        extra_config:
          remote_storage_plugin.cellar.module_path: cellar.integrations.lmcache
          remote_storage_plugin.cellar.class_name: CellarConnectorAdapter
          remote_storage_plugin.cellar.master: "127.0.0.1:7070"     # or etcd://host:port/cluster
          remote_storage_plugin.cellar.tenant: "default"            # optional
          remote_storage_plugin.cellar.timeout_s: 5.0               # optional, per Cellar call
          remote_storage_plugin.cellar.transport: auto              # optional: auto|tcp|shm|rdma
          save_chunk_meta: false                                    # optional, LMCache's own key

    (`CellarConnector` itself also loads as `class_name`: LMCache then wraps it in its
    `DynamicConnectorAdapter`.) The credential comes from `$CELLAR_TOKEN` or the token file
    `cellar up` writes, as for every SDK client.

What one object holds (one LMCache chunk of one rank)
    Key: `<format namespace>/<CacheEngineKey.to_string()>` (`cellar.integrations.kvformat`): the
    namespace hashes model, KV dtypes, chunk shapes, memory format, chunk size, world size or
    MLA, the chunk-metadata mode and this adapter's version, so a reader of another format asks
    for other keys and sees a miss.
    - `save_chunk_meta: false`: the value is the chunk's KV bytes and nothing else. Reads land
      straight in the `MemoryObj` the LocalCPUBackend allocated (zero-copy); a partial last
      chunk is an object of fewer whole tokens. The size rule is the guard: an object larger
      than a full chunk is refused by the SDK before any transfer, one that is not a whole
      number of tokens is refused after (its buffer goes back to the allocator, never to the
      engine).
    - `save_chunk_meta: true` (LMCache's default): the value is the kvformat header (32 bytes:
      fingerprint and payload size), LMCache's `RemoteMetadata` (shapes, dtypes, format,
      length) and the KV bytes, written and read as scatter-gather parts: the head in a small
      buffer, the KV bytes straight from and into the MemoryObj (zero-copy too). The header
      must match the reader's format and the object's exact size and the metadata must
      describe exactly that payload, or the chunk is refused and its MemoryObj goes back to
      the allocator. An object of any other size than a full chunk's is refused by the SDK
      before any transfer; the partial last chunk is then read alone at its own size.

Async without blocking the loop
    LMCache runs every connector coroutine on its own event loop thread. The connector's one
    `cellar.AsyncClient` lives on a loop thread of its own (`lmcache_session.CellarSession`,
    which says why): LMCache's coroutines await the client's calls there, so LMCache's loop
    is neither waiting on Cellar nor running Cellar's copies and checksums, and keeps serving
    other requests meanwhile. LMCache's synchronous entry points (exists_sync,
    batched_contains, remove_sync), called from the engine's threads, wait on the session
    directly.

Reads stop at the first chunk that does not load
    LMCache uses only the leading run of chunks it finds, so a batched read asks the SDK for
    that prefix (`get_many_into(..., prefix=True)`, bounded by `timeout_s`): chunks after a
    missing, late or refused one are never read, and their MemoryObjs go straight back.

Failures
    Nothing escapes into the engine: a Cellar error, an unreachable master or node, a timeout or
    a refused object is logged and becomes a miss (get), False (exists), a shorter prefix
    (contains), no keys (list) or a dropped write (put). A master that cannot be reached when the connector
    first needs it is asked again after `lmcache_session.RECONNECT_BACKOFF_S`; meanwhile every
    call is a miss at once.

What it must never do
    Hand the engine bytes of another format or of the wrong size, or block LMCache's loop.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector import (
    ConnectorAdapter,
    ConnectorContext,
    extract_plugin_type,
)
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

import cellar
from cellar.client import PutHints
from cellar.client.lookup import MAX_TOKENS_PER_KEY
from cellar.errors import AlreadyExists, InvalidArgument, Status
from cellar.integrations.kvformat import HEADER_BYTES, FormatMismatch, KVFormat
from cellar.integrations.lmcache.session import FAILURES, KEY_MISSES, CellarSession, read_into

log = logging.getLogger(__name__)
T = TypeVar("T")

PLUGIN_TYPE = "cellar"
ADAPTER_NAME = "lmcache"
# Bumped when the object layout above changes: every namespace changes with it.
ADAPTER_VERSION = 1
DEFAULT_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 600.0


def chunk_event_hash(chunk_hash: Any) -> int | None:
    """LMCache's chunk hash as the block hash of Cellar's KV events (docs/events.md): the
    `CacheEngineKey.chunk_hash` int when it fits the 64-bit engine hash, else None."""
    if isinstance(chunk_hash, int) and not isinstance(chunk_hash, bool) \
            and -(1 << 63) <= chunk_hash < 1 << 64:
        return chunk_hash
    return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in shape)


async def _get_prefix_into(client: cellar.AsyncClient, names: list[str],
                           buffers: Sequence[Any], budget_s: float) -> list[int]:
    """The leading run of objects read straight into their buffers: one size per key of that
    run (shorter than `names` when a key is missing, late or refused; keys after it are not
    read). An object larger than its buffer is refused (`session.read_into`)."""
    return [n for n in await read_into(client, names, buffers, budget_s, prefix=True) if n >= 0]


def chunk_format(connector: RemoteConnector, model: str, world_size: int,
                 use_mla: bool) -> KVFormat:
    """The KV format of the chunks this connector reads and writes."""
    meta_mode = "meta" if connector.save_chunk_meta else "raw"
    return KVFormat(
        model=model,
        kv_dtype="+".join(_dtype_name(d) for d in connector.meta_dtypes),
        layout=f"{connector.meta_fmt.name}.{meta_mode}",
        page_size_tokens=connector.full_chunk_size_bytes // connector.single_token_size,
        parallel_rule="mla" if use_mla else f"tp{world_size}",
        adapter=ADAPTER_NAME,
        adapter_version=ADAPTER_VERSION,
        shape=(("chunk_shapes", ";".join(_shape_text(s) for s in connector.meta_shapes)),
               ("chunk_bytes", str(connector.full_chunk_size_bytes))),
    )


class CellarConnector(RemoteConnector):
    """LMCache's `RemoteConnector` over a Cellar cluster (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: LocalCPUBackend,
                 config: LMCacheEngineConfig | None = None,
                 plugin_name: str | None = None) -> None:
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.plugin_name = plugin_name or PLUGIN_TYPE
        extra = dict((config or local_cpu_backend.config).extra_config or {})
        prefix = f"remote_storage_plugin.{self.plugin_name}."
        master = extra.get(prefix + "master")
        if not isinstance(master, str) or not master:
            raise InvalidArgument(f"extra_config {prefix}master must name the Cellar master "
                                  "(host:port or etcd://host:port/cluster)")
        raw_timeout = extra.get(prefix + "timeout_s", DEFAULT_TIMEOUT_S)
        try:
            timeout_s = float(raw_timeout)
        except (TypeError, ValueError):
            timeout_s = -1.0  # refused just below, with the setting's name
        if not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise InvalidArgument(f"{prefix}timeout_s must be a number of seconds in "
                                  f"(0, {MAX_TIMEOUT_S}], got {raw_timeout!r}")
        metadata = local_cpu_backend.metadata
        self.format = chunk_format(self, metadata.model_name, metadata.world_size,
                                   metadata.use_mla)
        self.read_budget_s = timeout_s
        # What precedes the KV bytes in an object (`save_chunk_meta: true` only).
        self.head_bytes = HEADER_BYTES + self.remote_metadata_bytes
        self.session = CellarSession(
            master, tenant=str(extra.get(prefix + "tenant", "default")),
            timeout_s=timeout_s, transport=str(extra.get(prefix + "transport", "auto")),
            on_open=self._describe_format)
        log.info("Cellar connector: master %s, format namespace %s (%s)", master,
                 self.format.namespace(), self.format.layout)

    # ---- names, sizes and the object layout ----------------------------------------------

    def _name(self, key: CacheEngineKey) -> str:
        return self.format.key(key.to_string())

    async def _describe_format(self, client: cellar.AsyncClient) -> None:
        """Store the format's descriptor once, so an operator can tell what a namespace holds;
        a chunk's tokens per key for the SDK's token metrics (a short last chunk counts whole)."""
        if 0 < self.format.page_size_tokens <= MAX_TOKENS_PER_KEY:
            client.tokens_per_key = self.format.page_size_tokens
        try:
            await client.put(self.format.descriptor_key(), self.format.descriptor())
        except AlreadyExists:
            pass
        except FAILURES as e:
            log.debug("Cellar: format descriptor not stored: %s", e)

    def _payload_ok(self, size_bytes: int) -> bool:
        """Whether a payload of `size_bytes` is whole tokens of this format, at most a chunk."""
        return (0 < size_bytes <= self.full_chunk_size_bytes
                and size_bytes % self.single_token_size == 0)

    def _meta_head(self, memory_obj: MemoryObj) -> bytes:
        """The kvformat header and LMCache's metadata: the first part of a chunk stored with
        `save_chunk_meta: true` (the KV bytes follow, sent from the MemoryObj itself)."""
        payload_bytes = memory_obj.get_size()
        meta = RemoteMetadata(payload_bytes, memory_obj.get_shapes(), memory_obj.get_dtypes(),
                              memory_obj.get_memory_format()).serialize()
        return self.format.header(len(meta) + payload_bytes) + meta

    def _value_parts(self, memory_obj: MemoryObj) -> list[Any]:
        """The parts of a chunk's object; the KV part is the allocator's memory itself."""
        if self.save_chunk_meta:
            return [self._meta_head(memory_obj), memory_obj.byte_array]
        return [memory_obj.byte_array]

    # ---- reads ---------------------------------------------------------------------------

    def _allocate(self, count: int) -> list[MemoryObj]:
        """Up to `count` full-chunk MemoryObjs, fewer if the LocalCPUBackend runs out."""
        objs: list[MemoryObj] = []
        for _ in range(count):
            obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes,
                                                  self.meta_fmt)
            if obj is None or obj.raw_tensor is None:
                break
            objs.append(obj)
        return objs

    async def _read_chunks(self, client: cellar.AsyncClient,
                           names: list[str]) -> list[MemoryObj]:
        """The leading run of chunks, read straight into MemoryObjs of the LocalCPUBackend,
        checked against this format and cut to the tokens they hold."""
        objs = self._allocate(len(names))
        if not objs:
            return []  # the LocalCPUBackend is full: a miss, nothing asked of Cellar
        names = names[:len(objs)]
        heads = [bytearray(self.head_bytes) for _ in objs] if self.save_chunk_meta else []
        loaded: list[MemoryObj] = []
        try:
            if heads:
                sizes = await self._get_meta_parts(client, names, objs, heads)
            else:
                sizes = await _get_prefix_into(client, names, [o.byte_array for o in objs],
                                               self.read_budget_s)
            for i, (name, obj, size) in enumerate(zip(names, objs, sizes, strict=False)):
                try:
                    payload = self._check_meta(heads[i], size) if heads else self._check_raw(size)
                except FormatMismatch as e:
                    log.warning("Cellar: %s refused: %s", name, e)
                    break
                loaded.append(self.reshape_partial_chunk(obj, payload))
        finally:
            for obj in objs[len(loaded):]:
                obj.ref_count_down()  # not read, or refused: back to the allocator
        return loaded

    def _check_raw(self, size: int) -> int:
        if not self._payload_ok(size):
            raise FormatMismatch(f"{size} bytes is not whole tokens of {self.single_token_size} "
                                 f"bytes up to {self.full_chunk_size_bytes}")
        return size

    def _check_meta(self, head: bytearray, size: int) -> int:
        """The payload size of a `save_chunk_meta` object of `size` bytes whose head was read
        into `head`, or FormatMismatch: another format's header, a size other than the header
        says, or metadata that does not describe exactly that payload in this format."""
        body = self.format.verify_header(head[:HEADER_BYTES], size)
        payload = body - self.remote_metadata_bytes
        try:
            meta = RemoteMetadata.deserialize(bytes(head[HEADER_BYTES:]))
        except (ValueError, KeyError, struct.error) as e:  # an unknown format or dtype code
            raise FormatMismatch(f"unreadable chunk metadata: {e}") from None
        stated = sum(torch.Size(s).numel() * d.itemsize
                     for s, d in zip(meta.shapes, meta.dtypes, strict=True))
        if (meta.length != payload or stated != payload or not self._payload_ok(payload)
                or list(meta.dtypes) != list(self.meta_dtypes) or meta.fmt != self.meta_fmt):
            raise FormatMismatch(f"chunk metadata (length {meta.length}, {stated} bytes by its "
                                 f"shapes) does not describe a payload of {payload} bytes")
        return payload

    async def _get_meta_parts(self, client: cellar.AsyncClient, names: list[str],
                              objs: list[MemoryObj], heads: list[bytearray]) -> list[int]:
        """Object sizes of the leading run, each object scattered into its head buffer and
        its MemoryObj. The SDK takes parts that add up to the object exactly, so the batch
        goes as full chunks; if an object is not one (LMCache's partial last chunk, or an
        object that is not ours) the SDK refuses the whole batch before any transfer, and the
        batch is asked again one key shorter each time (in practice once: only a prompt's last
        chunk is partial), the odd object then read alone at its own size."""
        parts = [[head, obj.byte_array] for head, obj in zip(heads, objs, strict=True)]
        count = len(names)
        sizes: list[int] = []
        while count > 0:
            try:
                sizes = await client.get_many_into_parts(names[:count], parts[:count],
                                                         timeout_s=self.read_budget_s,
                                                         prefix=True)
                break
            except InvalidArgument:
                count -= 1
        sizes = [n for n in sizes if n >= 0]
        if len(sizes) == count < len(names):
            sizes += await self._get_odd_meta(client, names[count], objs[count], heads[count])
        return sizes

    async def _get_odd_meta(self, client: cellar.AsyncClient, name: str, obj: MemoryObj,
                            head: bytearray) -> list[int]:
        """One `save_chunk_meta` object that is not a full chunk, read at its own size: [its
        size], or [] if it is missing or cannot be a chunk of this format (never read then)."""
        try:
            size = await client.size(name)
            payload = size - len(head)
            if not self._payload_ok(payload):
                log.warning("Cellar: %s refused: %d bytes is no chunk of this format", name, size)
                return []
            return [await client.get_into_parts(name, [head, obj.byte_array[:payload]])]
        except KEY_MISSES:
            return []

    async def _read_prefix(self, keys: Sequence[CacheEngineKey]) -> list[MemoryObj]:
        """The leading run of `keys` loaded from Cellar; empty on any Cellar failure."""
        names = [self._name(k) for k in keys]
        return await self._ask(lambda c: self._read_chunks(c, names),
                               f"read of {len(keys)} chunks", [])

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        """One MemoryObj per key of the leading run that loaded, None for the rest (keys after
        a missing one are not read: LMCache uses a prefix only)."""
        loaded: list[MemoryObj | None] = list(await self._read_prefix(keys))
        return loaded + [None] * (len(keys) - len(loaded))

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return (await self.batched_get([key]))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str,
                                       keys: list[CacheEngineKey]) -> list[MemoryObj]:
        """The leading run of chunks that loaded (one batched read, not one per key)."""
        return await self._read_prefix(keys)

    # ---- probes --------------------------------------------------------------------------

    async def _ask(self, fn: Callable[[cellar.AsyncClient], Awaitable[T]], what: str,
                   default: T) -> T:
        """A probe from LMCache's loop; `default` (a miss) when Cellar fails."""
        try:
            return await self.session.run(fn)
        except FAILURES as e:
            log.warning("Cellar: %s failed, reported %r: %s", what, default, e)
            return default

    def _ask_sync(self, fn: Callable[[cellar.AsyncClient], Awaitable[T]], what: str,
                  default: T) -> T:
        """A probe from an engine thread; `default` (a miss) when Cellar fails."""
        try:
            return self.session.run_sync(fn)
        except FAILURES as e:
            log.warning("Cellar: %s failed, reported %r: %s", what, default, e)
            return default

    async def exists(self, key: CacheEngineKey) -> bool:
        name = self._name(key)
        return await self._ask(lambda c: c.exists(name), "exists", False)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        name = self._name(key)
        return self._ask_sync(lambda c: c.exists(name), "exists", False)

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey],
                                     pin: bool = False) -> int:
        """How many leading chunks exist (one PrefixLen on the master's fast line; never pins:
        a probe must not make objects unevictable)."""
        names = [self._name(k) for k in keys]
        if not names:
            return 0
        return await self._ask(lambda c: c.prefix_len(names), "prefix lookup", 0)

    def support_batched_async_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        """`batched_async_contains` for LMCache's synchronous lookup (an engine thread)."""
        names = [self._name(k) for k in keys]
        if not names:
            return 0
        return self._ask_sync(lambda c: c.prefix_len(names), "prefix lookup", 0)

    def support_batched_contains(self) -> bool:
        return True

    def lookup(self, keys: list[CacheEngineKey], prefill_tokens_per_s: float | None = None,
               tokens_per_chunk: int | None = None) -> Any:
        """`Client.lookup` over chunks (docs/lookup.md): the leading run, its bytes, this
        client's estimated load time and, given the prefill rate and tokens per chunk, "load"
        or "recompute". None when the cluster cannot answer (as a miss)."""
        names = [self._name(k) for k in keys]
        if not names:
            return None
        return self._ask_sync(lambda c: c.lookup(names, prefill_tokens_per_s=prefill_tokens_per_s,
                                                 tokens_per_key=tokens_per_chunk), "lookup", None)

    # ---- writes --------------------------------------------------------------------------

    async def _write(self, client: cellar.AsyncClient, keys: Sequence[CacheEngineKey],
                     objs: Sequence[MemoryObj]) -> None:
        items = []
        hashes: dict[str, int] = {}  # LMCache's chunk hash rides in the KV events
        for key, obj in zip(keys, objs, strict=True):
            if not self._payload_ok(obj.get_size()):
                log.warning("Cellar: chunk %s of %d bytes is not whole tokens of this format; "
                            "not stored", key.to_string(), obj.get_size())
                continue
            name = self._name(key)
            items.append((name, self._value_parts(obj)))
            if (value := chunk_event_hash(key.chunk_hash)) is not None:
                hashes[name] = value
        if not items:
            return
        statuses = await client.put_many_parts(items, hints=PutHints(engine_hashes=hashes))
        failed = [s for s in statuses if s not in (Status.OK, Status.ALREADY_EXISTS)]
        if failed:
            log.warning("Cellar: %d of %d chunks not stored (%s)", len(failed), len(items),
                        ", ".join(sorted({s.name for s in failed})))

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        """Store the chunks; the caller (LMCache's instrumented wrapper) drops their refs."""
        if not keys:
            return
        try:
            await self.session.run(lambda c: self._write(c, keys, memory_objs))
        except FAILURES as e:
            log.warning("Cellar: put of %d chunks dropped: %s", len(keys), e)

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    # ---- the rest of RemoteConnector ------------------------------------------------------

    def remove_sync(self, key: CacheEngineKey) -> bool:
        name = self._name(key)
        return self._ask_sync(lambda c: c.remove(name), "remove", False)

    async def list(self) -> list[str]:
        """Every chunk key this connector's format holds, as LMCache key strings
        (`CacheEngineKey.to_string()`), ascending; the format's descriptor is not a chunk and
        is left out. One walk of ListKeys pages under the format's namespace (the SDK's
        `list_all_keys`: a linear scan of the tenant's keys on the master per page, at most
        `cellar.client.checks.MAX_LIST_ALL_KEYS` keys). [] when Cellar fails (logged), as
        for the connector's other calls."""
        prefix = self.format.key_prefix()
        descriptor = self.format.descriptor_key()
        names: list[str] = await self._ask(lambda c: c.list_all_keys(prefix), "list", [])
        return [name[len(prefix):] for name in names if name != descriptor]

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """0 when the master answers, 1 otherwise."""

        async def status(client: cellar.AsyncClient) -> int:
            await client.status()
            return 0

        return await self._ask(status, "ping", 1)

    async def close(self) -> None:
        await self.session.aclose()


class CellarConnectorAdapter(ConnectorAdapter):
    """What `remote_storage_plugin.<name>.class_name` names: builds a `CellarConnector` for
    `plugin://cellar` (or `plugin://cellar.<instance>`)."""

    def __init__(self) -> None:
        super().__init__(f"plugin://{PLUGIN_TYPE}")

    def can_parse(self, url: str) -> bool:
        return (url.startswith("plugin://")
                and extract_plugin_type(url[len("plugin://"):]) == PLUGIN_TYPE)

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        return CellarConnector(context.loop, context.local_cpu_backend, context.config,
                               plugin_name=context.plugin_name)


__all__ = ["ADAPTER_VERSION", "CellarConnector", "CellarConnectorAdapter", "chunk_format"]
