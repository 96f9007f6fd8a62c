"""cellar.compat.mooncake: Mooncake Store's Python API on Cellar, one import away.

    from cellar.compat.mooncake import MooncakeDistributedStore, ReplicateConfig

The store class lives in `store.py`; the rest of this subpackage is its parts (see
`cellar.compat`'s docstring for the map). This `__init__` only re-exports the public names, so
the path users type stays `cellar.compat.mooncake`.
"""

from __future__ import annotations

from cellar.compat.mooncake.codes import ErrorCode
from cellar.compat.mooncake.config import ReplicateConfig, SoftPinAction
from cellar.compat.mooncake.store import MooncakeDistributedStore

__all__ = ["ErrorCode", "MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction"]
