"""`MooncakeDistributedStore` on Cellar: Mooncake Store's Python API, one import away.

    from cellar.compat.mooncake import MooncakeDistributedStore, ReplicateConfig

    store = MooncakeDistributedStore()
    store.setup("localhost", "P2PHANDSHAKE", "512MB", "16MB", "tcp", "", "10.0.0.1:50051")
    store.put("k", b"v")          # 0
    store.get("k")                # b"v"; b"" when missing

What it owns
    The Mooncake 0.3.x surface (names, signatures, integer results) over one `cellar.Client`:
    setup (positional or a dict), the byte API, the zero-copy pointer API over registered
    buffers, scatter/gather, ranged reads, tensors, removal, health, and the embedded storage
    node a client with `global_segment_size > 0` contributes. docs/mooncake.md has the table of
    every Mooncake method: supported, supported with a difference, or NOT_SUPPORTED.

Contract
    Every method returns what Mooncake returns: 0 or a negative `ErrorCode` (codes from the one
    table in `codes`), byte counts, lists of those, `b""` / None for a miss. Nothing
    raises for a storage outcome; wrong Python argument types raise TypeError as pybind would.
    A put of an existing key returns 0 (Mooncake's cache semantics); `upsert` replaces.
    A method Cellar cannot honour returns NOT_SUPPORTED (-1012), never pretends.

Thread safety
    Like Mooncake's store, one instance may be used from many threads at once.

What it must never do
    Import `cellar.master` or `cellar.storage_node` (the embedded node is a `cellar node` child
    process, see `mooncake_node`); touch memory outside a registered buffer.
"""

from __future__ import annotations

import re
import socket
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cellar
from cellar.client import Client
from cellar.client.pointers import PointerRegistry
from cellar.client.probe import probe_master
from cellar.compat.mooncake import io
from cellar.compat.mooncake import ranges as mooncake_ranges
from cellar.compat.mooncake.codes import ErrorCode, code_for, put_code
from cellar.compat.mooncake.config import ReplicateConfig, SoftPinAction
from cellar.compat.mooncake.memory import BufferHandle, lease_parts
from cellar.compat.mooncake.node import EmbeddedNode, free_port
from cellar.compat.mooncake.setup_args import SetupConfig, SetupError, build, from_dict
from cellar.compat.mooncake.unsupported import UNSUPPORTED, not_supported
from cellar.compat.mooncake.writes import PutArgs, Writer, split_leased, split_segment
from cellar.errors import BufferTooSmall, CellarError, Timeout, Unavailable

__all__ = ["ErrorCode", "MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction"]

CLIENT_TIMEOUT_S = 30.0         # every SDK call's deadline (Mooncake's RPCs have their own)
HEALTH_TIMEOUT_S = 2.0          # health_check asks the master at most this long
GET_BUFFER_ATTEMPTS = 2         # get_buffer sizes then reads; an upsert in between costs a retry
HC_HEALTHY, HC_NOT_INITIALIZED, HC_MASTER_UNREACHABLE = 0, 1, 2
INVALID = int(ErrorCode.INVALID_PARAMS)


def _teardown(client: Client, node: EmbeddedNode | None) -> None:
    if node is not None:
        node.stop()
    client.close()


class MooncakeDistributedStore:
    """Mooncake's store class, backed by a Cellar cluster (see the module doc)."""

    client_timeout_s: float = CLIENT_TIMEOUT_S
    """Deadline of each SDK call, setup's connect included (seconds); set before setup()."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._node: EmbeddedNode | None = None
        self._config: SetupConfig | None = None
        self._writer: Writer | None = None
        self._segment_name = ""    # get_hostname(): "host:port", as Mooncake names segments
        self._pointers = PointerRegistry()   # what register_buffer vouched for (the SDK's rules)
        self._finalizer: weakref.finalize | None = None

    # ---- lifecycle ------------------------------------------------------------------------

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, rdma_devices, master_server_addr, engine=None, enable_ssd_offload=False,
        ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
        client_http_port=...) or setup(config_dict); 0 or a negative code."""
        if len(args) == 1 and isinstance(args[0], Mapping) and not kwargs:
            make: Callable[[], SetupConfig] = lambda: from_dict(args[0])  # noqa: E731
        elif not args and set(kwargs) == {"config"} and isinstance(kwargs["config"], Mapping):
            make = lambda: from_dict(kwargs["config"])  # noqa: E731
        else:
            make = lambda: build(*args, **kwargs)  # noqa: E731
        try:
            config = make()  # a wrong argument list raises TypeError, as pybind does
        except SetupError as exc:
            return int(exc.code)
        return self._start(config)

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Mooncake's dummy client shares memory with a local real-client process. Cellar
        has no such process: every client talks to the cluster itself, so this connects to the
        Cellar master at `server_address` without contributing memory (mem_pool_size unused)."""
        try:
            config = build(socket.gethostname(), "", 0, local_buffer_size, "tcp", "",
                           server_address)
        except SetupError as exc:
            return int(exc.code)
        return self._start(config)

    def _start(self, config: SetupConfig) -> int:
        with self._lock:
            if self._client is not None:
                return INVALID  # set up already (Mooncake: "already initialized")
            try:
                client = cellar.connect(config.master_address, tenant=config.tenant,
                                        timeout_s=self.client_timeout_s,
                                        transport=config.transport)
            except CellarError as exc:
                return code_for(exc)
            # Mooncake names this client's segment "host:port" (its transfer engine's port: the
            # one given, else a free one in 12300..14300); the embedded node listens there.
            host, port = split_segment(config.local_hostname)
            port = port or free_port(_listen_host(host))
            node = None
            if config.global_segment_bytes > 0:
                node = EmbeddedNode(config.master_address, config.global_segment_bytes,
                                    _listen_host(host), port, disk_dir=config.disk_dir,
                                    disk_bytes=config.disk_bytes)
                try:
                    node.start(lambda: [n["node_id"] for n in client.status()["nodes"]])
                except SetupError as exc:
                    client.close()
                    return int(exc.code)
            self._segment_name = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            self._writer = Writer(client, config.local_buffer_bytes, self._segment_name,
                                  node.node_id if node is not None else None)
            self._client, self._node, self._config = client, node, config
            self._finalizer = weakref.finalize(self, _teardown, client, node)
            return 0

    def close(self) -> int:
        """Stop the embedded node (its objects leave the cluster) and disconnect; 0."""
        with self._lock:
            finalizer, self._finalizer = self._finalizer, None
            self._client = self._node = self._config = self._writer = None
            self._segment_name = ""
            self._pointers = PointerRegistry()
        if finalizer is not None:
            finalizer()
        return 0

    def get_hostname(self) -> str:
        """This client's segment name, "host:port" as Mooncake returns it ("" before setup)."""
        return self._segment_name

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 master unreachable (Mooncake's values)."""
        client = self._client
        if client is None:
            return HC_NOT_INITIALIZED
        try:
            probe_master(client.master_address, tenant=client.tenant, timeout_s=HEALTH_TIMEOUT_S)
        except CellarError:  # unreachable, timed out, or not answering as a master
            return HC_MASTER_UNREACHABLE
        return HC_HEALTHY

    @property
    def embedded_node(self) -> EmbeddedNode | None:
        """The storage node this store runs (global_segment_size > 0), else None."""
        return self._node

    # ---- bytes ----------------------------------------------------------------------------

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        return self._put_values([key], [value], config, upsert=False)[0]

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        return self._put_values([key], [value], config, upsert=True)[0]

    def put_batch(self, keys: Sequence[str], values: Sequence[Any],
                  config: ReplicateConfig | None = None) -> int:
        return _first_error(self._put_values(keys, values, config, upsert=False))

    def upsert_batch(self, keys: Sequence[str], values: Sequence[Any],
                     config: ReplicateConfig | None = None) -> int:
        return _first_error(self._put_values(keys, values, config, upsert=True))

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._put_byte_parts(key, parts, config, upsert=False)

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._put_byte_parts(key, parts, config, upsert=True)

    def get(self, key: str) -> bytes:
        """The value, or b"" when it is missing or unreadable (Mooncake's convention)."""
        client = self._client
        if client is None:
            return b""
        got = io.read_whole(client, key)
        return got if isinstance(got, bytes) else b""

    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        client, names = self._client, list(keys)
        if client is None:
            return [b""] * len(names)
        try:
            values = client.get_many(names)
        except (Unavailable, Timeout):
            return [b""] * len(names)
        except CellarError:
            return [self.get(k) for k in names]  # one key's problem: read them one by one
        return [v if v is not None else b"" for v in values]

    def get_size(self, key: str) -> int:
        client = self._client
        if client is None:
            return INVALID
        try:
            return client.size(key)
        except CellarError as exc:
            return code_for(exc)

    def is_exist(self, key: str) -> int:
        """1 present, 0 absent, negative on error."""
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        client, names = self._client, list(keys)
        if client is None:
            return [INVALID] * len(names)
        return io.exists_codes(client, names)

    def remove(self, key: str, force: bool = False) -> int:
        """0, or OBJECT_NOT_FOUND. `force` changes nothing: Cellar removes a pinned object at
        once for new readers (readers holding it finish first)."""
        return self.batch_remove([key], force)[0]

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        client, names = self._client, list(keys)
        if client is None:
            return [INVALID] * len(names)
        out = []
        for key in names:
            try:
                out.append(0 if client.remove(key) else int(ErrorCode.OBJECT_NOT_FOUND))
            except CellarError as exc:
                out.append(code_for(exc))
        return out

    def remove_all(self, force: bool = False) -> int:
        """Remove every key of this store's tenant; the count."""
        client = self._client
        return io.remove_all(client) if client is not None else INVALID

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Remove the keys the pattern finds (regex search, as Mooncake); the count. The
        patterns that mean "starts with L" (`^L`, `^L.*`), "is exactly L" (`^L$`) or
        "anything" (`.*`, `^`) are one master call (RemovePrefix, Remove, RemoveAll); any
        other is served by listing the tenant's keys page by page and removing each page's
        matches (`io.remove_matching`: not atomic, a cost in the tenant's key count)."""
        client = self._client
        if client is None:
            return INVALID
        try:
            compiled = re.compile(regex_pattern)
        except (re.error, TypeError):
            return INVALID
        kind, literal = _literal_pattern(regex_pattern)
        try:
            if kind == "all":
                return io.remove_all(client)
            if kind == "prefix":
                return client.remove_prefix(literal)
            if kind == "exact":
                return 1 if client.remove(literal) else 0
        except CellarError as exc:
            return code_for(exc)
        return io.remove_matching(client, compiled)

    # ---- registered memory and pointers ---------------------------------------------------

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Vouch for [buffer_ptr, +size): the pointer methods use only registered memory.

        The table is the SDK's `PointerRegistry` (its rules: overlapping registrations count as
        their union, the same one twice is a no-op), held by this store: the store hands the SDK
        views of it, because Mooncake reports a bad pointer per key where the SDK's pointer
        batch calls refuse the whole batch."""
        if self._client is None:
            return INVALID
        try:
            self._pointers.register(buffer_ptr, size)
        except CellarError as exc:
            return code_for(exc)
        return 0

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """INVALID_PARAMS if no registration starts there, or a call is using it."""
        if self._client is None:
            return INVALID
        try:
            self._pointers.unregister(buffer_ptr)
        except CellarError as exc:
            return code_for(exc)
        return 0

    def put_from(self, key: str, buffer_ptr: int, size: int,
                 config: ReplicateConfig | None = None) -> int:
        return self.batch_put_from([key], [buffer_ptr], [size], config)[0]

    def upsert_from(self, key: str, buffer_ptr: int, size: int,
                    config: ReplicateConfig | None = None) -> int:
        return self.batch_upsert_from([key], [buffer_ptr], [size], config)[0]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read into the registered buffer, or a negative code (INVALID_PARAMS when
        `size` is smaller than the object, as Mooncake)."""
        return self.batch_get_into([key], [buffer_ptr], [size])[0]

    def batch_put_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                       sizes: Sequence[int], config: ReplicateConfig | None = None) -> list[int]:
        return self._put_pointers(keys, [[p] for p in buffer_ptrs], [[s] for s in sizes],
                                  config, upsert=False, same_len=(buffer_ptrs, sizes))

    def batch_upsert_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                          sizes: Sequence[int], config: ReplicateConfig | None = None) -> list[int]:
        return self._put_pointers(keys, [[p] for p in buffer_ptrs], [[s] for s in sizes],
                                  config, upsert=True, same_len=(buffer_ptrs, sizes))

    def batch_put_from_multi_buffers(self, keys: Sequence[str],
                                     all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]],
                                     config: ReplicateConfig | None = None) -> list[int]:
        """Each key's value is its buffers concatenated in order (gather)."""
        return self._put_pointers(keys, all_buffer_ptrs, all_sizes, config, upsert=False,
                                  same_len=(all_buffer_ptrs, all_sizes))

    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                       sizes: Sequence[int]) -> list[int]:
        return self._get_pointers(keys, [[p] for p in buffer_ptrs], [[s] for s in sizes],
                                  same_len=(buffer_ptrs, sizes))

    def batch_get_into_multi_buffers(self, keys: Sequence[str],
                                     all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]],
                                     prefer_alloc_in_same_node: bool = False) -> list[int]:
        """Each object scattered over its buffers in order (their total may exceed it, as in
        Mooncake); bytes read per key. prefer_alloc_in_same_node is accepted: with
        protocol="auto" a same-host replica is always read through shared memory."""
        return self._get_pointers(keys, all_buffer_ptrs, all_sizes,
                                  same_len=(all_buffer_ptrs, all_sizes))

    def get_into_ranges(self, buffer_ptrs: Sequence[int], all_keys: Sequence[Sequence[str]],
                        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
                        all_src_offsets: Sequence[Sequence[Sequence[int]]],
                        all_sizes: Sequence[Sequence[Sequence[int]]]) -> list[list[list[int]]]:
        """results[i][j][k]: bytes of fragment k of key j landed in buffer i, or negative."""
        return mooncake_ranges.get_into_ranges(
            self._client, self._pointers, buffer_ptrs, all_keys, all_dst_offsets,
            all_src_offsets, all_sizes)

    def get_buffer(self, key: str) -> BufferHandle | None:
        """The object in a buffer this handle owns (ptr(), size(), buffer protocol), or None."""
        client = self._client
        if client is None:
            return None
        for _attempt in range(GET_BUFFER_ATTEMPTS):
            try:
                handle = BufferHandle(client.size(key))
                n = client.get_into(key, handle)
            except BufferTooSmall:
                continue  # replaced by a larger value between size and read
            except CellarError:
                return None
            if n == len(handle):
                return handle
        return None

    def batch_get_buffer(self, keys: Sequence[str]) -> list[BufferHandle | None]:
        return [self.get_buffer(k) for k in keys]

    # ---- tensors --------------------------------------------------------------------------

    def put_tensor(self, key: str, tensor: Any) -> int:
        return self.batch_put_tensor([key], [tensor])[0]

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        return self.batch_upsert_tensor([key], [tensor])[0]

    def get_tensor(self, key: str) -> Any:
        return self.batch_get_tensor([key])[0]

    def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        """Tensors with dtype and shape stored beside the bytes (the SDK's tensor face)."""
        return self._put_tensors(keys, tensors_list, upsert=False)

    def batch_upsert_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        return self._put_tensors(keys, tensors_list, upsert=True)

    def _put_tensors(self, keys: Sequence[str], tensors_list: Sequence[Any], *,
                     upsert: bool) -> list[int]:
        client, names = self._client, list(keys)
        if client is None or len(names) != len(tensors_list):
            return [INVALID] * len(names)
        try:
            statuses = client.put_tensors(names, list(tensors_list), upsert=upsert)
        except CellarError as exc:
            return [put_code(exc)] * len(names)
        return [put_code(st) for st in statuses]

    def batch_get_tensor(self, keys: Sequence[str]) -> list[Any]:
        """Tensors in key order; None for a missing or unreadable key."""
        client, names = self._client, list(keys)
        if client is None:
            return [None] * len(names)
        try:
            return list(client.get_tensors(names))
        except (Unavailable, Timeout):
            return [None] * len(names)
        except CellarError:  # one key's problem (not a tensor, say): read them one by one
            return [self._get_tensor_one(client, k) for k in names]

    @staticmethod
    def _get_tensor_one(client: Client, key: str) -> Any:
        try:
            return client.get_tensor(key)
        except CellarError:
            return None

    # ---- plumbing -------------------------------------------------------------------------

    def _write_args(self, config: ReplicateConfig | None,
                    keys: int) -> tuple[Writer, PutArgs] | int:
        """The writer and the put arguments of `config`, or the code refusing the write."""
        writer = self._writer
        if writer is None:
            return INVALID
        args = writer.args(config, keys)
        return args if isinstance(args, int) else (writer, args)

    def _put_values(self, keys: Sequence[str], values: Sequence[Any],
                    config: ReplicateConfig | None, *, upsert: bool) -> list[int]:
        names = list(keys)
        ready = self._write_args(config, len(names))
        if isinstance(ready, int) or len(names) != len(values):
            return [ready if isinstance(ready, int) else INVALID] * len(names)
        writer, args = ready
        return writer.put_values(names, values, args, upsert=upsert)

    def _put_byte_parts(self, key: str, parts: Sequence[Any], config: ReplicateConfig | None, *,
                        upsert: bool) -> int:
        ready = self._write_args(config, 1)
        if isinstance(ready, int):
            return ready
        writer, args = ready
        return writer.put_byte_parts(key, parts, args, upsert=upsert)

    def _put_pointers(self, keys: Sequence[str], ptrs: Sequence[Sequence[int]],
                      sizes: Sequence[Sequence[int]], config: ReplicateConfig | None, *,
                      upsert: bool, same_len: tuple[Sequence[Any], Sequence[Any]]) -> list[int]:
        names = list(keys)
        ready = self._write_args(config, len(names))
        if isinstance(ready, int) or not len(names) == len(same_len[0]) == len(same_len[1]):
            return [ready if isinstance(ready, int) else INVALID] * len(names)
        writer, args = ready
        return writer.put_pointers(self._pointers, names, ptrs, sizes, args, upsert=upsert)

    def _get_pointers(self, keys: Sequence[str], ptrs: Sequence[Sequence[int]],
                      sizes: Sequence[Sequence[int]], *,
                      same_len: tuple[Sequence[Any], Sequence[Any]]) -> list[int]:
        names = list(keys)
        client = self._client
        if client is None or not len(names) == len(same_len[0]) == len(same_len[1]):
            return [INVALID] * len(names)
        with lease_parts(self._pointers, ptrs, sizes, writable=True) as per_key:
            out, items, where = split_leased(per_key)
            chosen = [names[i] for i in where]
            if all(len(v) == 1 for v in items):
                got = io.get_views(client, chosen, [v[0] for v in items])
            else:
                got = io.get_parts(client, chosen, items)
        for i, n in zip(where, got, strict=True):
            out[i] = n
        return out


for _name in UNSUPPORTED:
    assert not hasattr(MooncakeDistributedStore, _name), _name  # served ones are not listed
    setattr(MooncakeDistributedStore, _name, not_supported(_name))


def _first_error(codes: list[int]) -> int:
    return next((c for c in codes if c != 0), 0)


def _listen_host(host: str) -> str:
    """Where the embedded node listens: the host of Mooncake's local_hostname."""
    return host or "127.0.0.1"


_LITERAL = re.compile(r"(?:[A-Za-z0-9_\-/:@,=!%~#&' ]|\\[^A-Za-z0-9])*")
_ANY_TAIL = (".*", ".*$", "")


def _literal_pattern(pattern: str) -> tuple[str, str]:
    """("all"|"prefix"|"exact"|"other", literal) for a regex searched in every key."""
    if pattern in ("", ".*", "^", "^.*", "^.*$"):
        return "all", ""
    if not pattern.startswith("^"):
        return "other", ""
    match = _LITERAL.match(pattern, 1)
    assert match is not None  # the pattern matches the empty string
    body, tail = match.group(0), pattern[match.end():]
    literal = re.sub(r"\\(.)", r"\1", body)
    if not literal:
        return "other", ""
    if tail == "$":
        return "exact", literal
    if tail in _ANY_TAIL:
        return "prefix", literal
    return "other", ""
