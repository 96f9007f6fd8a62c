"""Test hook for the fault tests of late node-local writes, loaded by every Python process whose
PYTHONPATH starts with this folder. Not part of Cellar; nothing outside those tests puts this
folder on a path.

- CELLAR_TEST_MOVE_DELAY_S (tests/faults/test_disk_mover_remount.py): each tier move waits that
  long before it starts, so a node's demotions queue up as on a slow disk.
- CELLAR_TEST_COPY_DELAY_S (tests/faults/test_copier_remount.py): each copy waits that long
  after its target range was admitted and before it reads the source, as behind a slow source.
"""

from __future__ import annotations

import os
import time
from typing import Any

_MOVE_DELAY_S = float(os.environ.get("CELLAR_TEST_MOVE_DELAY_S") or 0)
_COPY_DELAY_S = float(os.environ.get("CELLAR_TEST_COPY_DELAY_S") or 0)

if _MOVE_DELAY_S > 0:
    from cellar.storage_node import disk_tier

    _move_one = disk_tier.TierMover.move_one

    def _slow_move_one(self: Any, move: Any, **kwargs: Any) -> Any:
        time.sleep(_MOVE_DELAY_S)
        return _move_one(self, move, **kwargs)

    disk_tier.TierMover.move_one = _slow_move_one  # type: ignore[method-assign]

if _COPY_DELAY_S > 0:
    import asyncio

    from cellar.storage_node import copier

    _fill = copier.Copier._fill

    async def _slow_fill(self: Any, *args: Any) -> Any:
        await asyncio.sleep(_COPY_DELAY_S)
        return await _fill(self, *args)

    copier.Copier._fill = _slow_fill  # type: ignore[method-assign]
