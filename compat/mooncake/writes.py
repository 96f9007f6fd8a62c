"""Writes of `MooncakeDistributedStore`: a `ReplicateConfig` made into SDK put arguments, and
the puts themselves (values, byte parts, registered pointers) with per-key Mooncake codes.

What it owns
    `Writer`, one per set-up store: `args(config, keys)` turns a config into `PutArgs`
    (replicas, soft pin, `cellar.client.PutHints`: a soft pin's lapse, a hard pin, the host
    that should take the first replica) or a Mooncake code; `put_values`, `put_byte_parts` and
    `put_pointers` store and report one code per key.

Preferred segments (Mooncake names a segment by its owner's `host:port`, what
`get_hostname()` returns)
    A segment name becomes a Cellar host id, which the master's placement honours when a node
    of that host has room (the first replica goes there; otherwise anywhere, as Mooncake falls
    back): this store's own name, and prefer_alloc_in_same_node, mean this store's embedded
    node (or a node with an endpoint on this machine); another name means the node listening
    at that address, else a node on that host. The names are read from the master's node list
    (`Client.status`, cached for `RESOLVE_CACHE_S`). A name no node matches places as usual.

What it must never do
    Raise for a storage outcome, or send a hint the caller did not ask for.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cellar.client import Client, PutHints
from cellar.client.pointers import PointerRegistry
from cellar.compat.mooncake import io
from cellar.compat.mooncake.codes import ErrorCode
from cellar.compat.mooncake.config import OptionError, ReplicateConfig, WriteOptions, write_options
from cellar.compat.mooncake.memory import lease_parts
from cellar.errors import CellarError

INVALID = int(ErrorCode.INVALID_PARAMS)
RESOLVE_CACHE_S = 5.0           # how long the master's node list answers segment names
_LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", ""})


@dataclass(frozen=True, slots=True)
class PutArgs:
    replicas: int = 1
    soft_pin: bool = False
    hints: PutHints | None = None


def split_segment(name: str) -> tuple[str, int]:
    """(host, port) of a Mooncake segment name ("host", "host:port", "[v6]:port"); port 0
    when it names none."""
    if name.startswith("["):
        host, _, rest = name[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif name.count(":") == 1:
        host, port = name.split(":", 1)
    else:
        host, port = name, ""
    return host, int(port) if port.isdigit() else 0


def _local_hosts() -> set[str]:
    names = set(_LOCAL_NAMES) | {socket.gethostname(), socket.getfqdn()}
    try:
        names.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    return names


class Writer:
    """The write half of one set-up store (see the module docstring)."""

    def __init__(self, client: Client, local_buffer_bytes: int, own_segment: str,
                 own_node_id: str | None) -> None:
        self.client = client
        self.local_buffer_bytes = local_buffer_bytes
        self.own_segment = own_segment
        self.own_node_id = own_node_id
        self._lock = threading.Lock()
        self._nodes: list[dict[str, Any]] = []
        self._nodes_at = -RESOLVE_CACHE_S
        self._local = _local_hosts()

    # ---- options -----------------------------------------------------------------------------

    def args(self, config: ReplicateConfig | None, keys: int) -> PutArgs | int:
        """The SDK's put arguments for `config`, or the Mooncake code refusing it."""
        try:
            options = write_options(config, keys)
        except OptionError as exc:
            return int(exc.code)
        host = self._preferred_host(options)
        hints = PutHints(options.soft_pin_ttl_ms, options.hard_pin, host)
        return PutArgs(options.replicas, options.soft_pin,
                       hints if hints != PutHints() else None)

    def _preferred_host(self, options: WriteOptions) -> str:
        names = ((self.own_segment,) if options.local else ()) + options.preferred_segments
        for name in names:
            host_id = self._host_of(name)
            if host_id:
                return host_id
        return ""

    def _node_list(self) -> list[dict[str, Any]]:
        with self._lock:
            if time.monotonic() - self._nodes_at < RESOLVE_CACHE_S:
                return self._nodes
        try:
            nodes = [n for n in self.client.status()["nodes"] if n.get("state") == "ACTIVE"]
        except CellarError:
            nodes = []
        with self._lock:
            self._nodes, self._nodes_at = nodes, time.monotonic()
        return nodes

    def _host_of(self, segment: str) -> str:
        """The host id of the node a Mooncake segment name means, or ""."""
        nodes = self._node_list()
        own = segment == self.own_segment
        if own and self.own_node_id is not None:
            for node in nodes:
                if node["node_id"] == self.own_node_id:
                    return str(node["host_id"])
        host, port = split_segment(segment)
        local = own or host in self._local
        by_host = ""
        for node in nodes:
            for address in node.get("endpoints", {}).values():
                node_host, node_port = split_segment(str(address))
                same_host = node_host == host or (local and node_host in self._local)
                if same_host and port and node_port == port:
                    return str(node["host_id"])  # the node listening at that address
                if same_host and not by_host:
                    by_host = str(node["host_id"])
        return by_host

    # ---- puts --------------------------------------------------------------------------------

    def put_values(self, keys: Sequence[str], values: Sequence[Any], args: PutArgs, *,
                   upsert: bool) -> list[int]:
        """Non-zero-copy writes: Mooncake stages them in the local buffer, so a value larger
        than local_buffer_size fails there (INVALID_PARAMS); Cellar sends from the caller's
        buffer, and keeps the limit so code tuned against Mooncake fails the same way."""
        names = list(keys)
        out, items, where = [0] * len(names), [], []
        for i, (key, value) in enumerate(zip(names, values, strict=True)):
            try:
                view = memoryview(value)
            except TypeError:
                out[i] = INVALID
                continue
            if view.nbytes > self.local_buffer_bytes:
                out[i] = INVALID
                continue
            items.append((key, view))
            where.append(i)
        codes = io.put_views(self.client, items, replicas=args.replicas, soft_pin=args.soft_pin,
                             upsert=upsert, hints=args.hints)
        for i, code in zip(where, codes, strict=True):
            out[i] = code
        return out

    def put_byte_parts(self, key: str, parts: Sequence[Any], args: PutArgs, *,
                       upsert: bool) -> int:
        """put_parts/upsert_parts: one object from byte-like parts, sent as they are (no join)."""
        try:
            views = [memoryview(p).cast("B") for p in parts]
        except (TypeError, ValueError):
            return INVALID
        if not views or sum(v.nbytes for v in views) > self.local_buffer_bytes:
            return INVALID  # Mooncake stages these in the local buffer (see put_values)
        return io.put_parts(self.client, [(key, views)], replicas=args.replicas,
                            soft_pin=args.soft_pin, upsert=upsert, hints=args.hints)[0]

    def put_pointers(self, pointers: PointerRegistry, keys: Sequence[str],
                     ptrs: Sequence[Sequence[int]], sizes: Sequence[Sequence[int]],
                     args: PutArgs, *, upsert: bool) -> list[int]:
        names = list(keys)
        with lease_parts(pointers, ptrs, sizes, writable=False) as per_key:
            out, items, where = split_leased(per_key)
            names_views = [(names[i], v) for i, v in zip(where, items, strict=True)]
            opts: dict[str, Any] = {"replicas": args.replicas, "soft_pin": args.soft_pin,
                                    "upsert": upsert, "hints": args.hints}
            if all(len(v) == 1 for _, v in names_views):
                codes = io.put_views(self.client, [(k, v[0]) for k, v in names_views], **opts)
            else:
                codes = io.put_parts(self.client, names_views, **opts)
        for i, code in zip(where, codes, strict=True):
            out[i] = code
        return out


def split_leased(per_key: list[list[memoryview] | int]) -> tuple[list[int], list[list[memoryview]], list[int]]:
    """(results with each refused key's code, the usable keys' views, their indexes)."""
    out = [v if isinstance(v, int) else 0 for v in per_key]
    where = [i for i, v in enumerate(per_key) if not isinstance(v, int)]
    items = [v for v in per_key if not isinstance(v, int)]
    return out, items, where
