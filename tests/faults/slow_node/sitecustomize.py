"""Test hook for tests/faults/test_disk_mover_remount.py, loaded by every Python process whose
PYTHONPATH starts with this folder: with CELLAR_TEST_MOVE_DELAY_S set, each tier move waits
that long before it starts, so a node's demotions queue up as on a slow disk. Not part of
Cellar; nothing outside that test puts this folder on a path."""

from __future__ import annotations

import os
import time
from typing import Any

_DELAY_S = float(os.environ.get("CELLAR_TEST_MOVE_DELAY_S") or 0)

if _DELAY_S > 0:
    from cellar.storage_node import disk_tier

    _move_one = disk_tier.TierMover.move_one

    def _slow_move_one(self: Any, move: Any, **kwargs: Any) -> Any:
        time.sleep(_DELAY_S)
        return _move_one(self, move, **kwargs)

    disk_tier.TierMover.move_one = _slow_move_one  # type: ignore[method-assign]
