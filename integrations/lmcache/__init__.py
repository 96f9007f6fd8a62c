"""cellar.integrations.lmcache: Cellar as an LMCache remote-storage plugin (LMCache 0.5.6).

LMCache loads it by configuration (`remote_storage_plugin.cellar.module_path:
cellar.integrations.lmcache`, `class_name: CellarConnectorAdapter`). `connector.py` is the
connector and its adapter, `session.py` its `cellar.AsyncClient` on an event loop of its own.
The connector's names are resolved lazily here, so that `session` stays importable without
LMCache or torch: only `connector` imports the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_CONNECTOR_NAMES = ("ADAPTER_VERSION", "CellarConnector", "CellarConnectorAdapter", "chunk_format")
__all__ = list(_CONNECTOR_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _CONNECTOR_NAMES:
        raise AttributeError(f"module 'cellar.integrations.lmcache' has no attribute {name!r}")
    return getattr(importlib.import_module("cellar.integrations.lmcache.connector"), name)
