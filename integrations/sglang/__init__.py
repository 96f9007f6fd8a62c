"""cellar.integrations.sglang: Cellar as SGLang HiCache's L3 storage backend.

SGLang loads it by configuration (`"module_path": "cellar.integrations.sglang",
"class_name": "CellarHiCacheStorage"`). `backend.py` is the class, `link.py` its one SDK
client (never raising), `pages.py` where a page's bytes live in SGLang's host pool, `timeout.py` SGLang's timeout
prefetch budget sized from Cellar's load estimate.
The backend's names are resolved lazily here, so that `link` and `pages` stay importable (and
testable) in an interpreter without SGLang: only `backend` imports the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_BACKEND_NAMES = ("CellarHiCacheStorage", "settings_from", "sglang_timeout_policy",
                  "page_format", "ADAPTER", "ADAPTER_VERSION", "TARGET_SGLANG")
__all__ = list(_BACKEND_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _BACKEND_NAMES:
        raise AttributeError(f"module 'cellar.integrations.sglang' has no attribute {name!r}")
    return getattr(importlib.import_module("cellar.integrations.sglang.backend"), name)
