"""Cellar: a distributed key/value object store for LLM KV caches.

The package root is the kernel, the ground floor every room stands on: typed errors
(`cellar.errors`), the layered configuration (`cellar.config`), size/duration units, client
credentials, the token store, the cluster secret, TLS contexts, the small HTTP server (with its
TLS, `cellar.http_tls`) and the one way callers ask an HTTP port (`cellar.http_fetch`), heap and
process-lifecycle upkeep; and the `cellar` command (`cellar.cli`), whose subcommands are
imported lazily by name. The tools (`cellar up`, `cellar soak`, the local cluster) live in
`cellar.devtools`; leader election and discovery in `cellar.coord`. The SDK is exported here
lazily (`cellar.connect`, `cellar.Client`, `cellar.connect_async`, `cellar.AsyncClient`) so that
importing `cellar.master` or `cellar.storage_node` never loads client code (the type-only import
below is the one exception the checker sees).
Import rule: must not import cellar.master.*, cellar.storage_node.*, cellar.transfer.*, cellar.coord.*, cellar.devtools.*, cellar.bench.*, cellar.integrations.*, cellar.compat.*
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cellar.errors import (
    AlreadyExists,
    BufferTooSmall,
    CellarError,
    ConfigError,
    IntegrityError,
    InvalidArgument,
    NoSpace,
    NotFound,
    NotReady,
    PermissionDenied,
    QuotaExceeded,
    Status,
    Timeout,
    Unauthenticated,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "LATE", "MISS", "AlreadyExists", "AsyncClient", "BufferTooSmall", "CellarError", "Client",
    "ClientClosed", "ConfigError", "IntegrityError", "InvalidArgument", "NoSpace", "NotFound",
    "NotReady", "PermissionDenied", "QuotaExceeded", "Status", "Timeout", "Unauthenticated",
    "Unavailable", "alloc_buffer", "connect", "connect_async",
]

_LAZY = {"connect": "cellar.client", "Client": "cellar.client", "alloc_buffer": "cellar.client",
         "AsyncClient": "cellar.client", "connect_async": "cellar.client",
         "MISS": "cellar.client", "LATE": "cellar.client", "ClientClosed": "cellar.client"}

if TYPE_CHECKING:
    from cellar.client import (
        LATE,
        MISS,
        AsyncClient,
        Client,
        ClientClosed,
        alloc_buffer,
        connect,
        connect_async,
    )


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'cellar' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
