"""cellar.integrations.lmcache: Cellar under LMCache 0.5.6, by configuration only.

Two ways in: the remote-storage plugin (`remote_storage_plugin.cellar.module_path:
cellar.integrations.lmcache`, `class_name: CellarConnectorAdapter`; `connector.py`), and
multiprocess mode's L2 adapter (`--l2-adapter '{"type": "plugin", "module_path":
"cellar.integrations.lmcache.l2_adapter", "class_name": "CellarL2Adapter", ...}'`;
`l2_adapter.py`, imported by LMCache by that path, not re-exported here). Both use
`session.py`: the `cellar.AsyncClient` on an event loop of its own and the batched read.
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
