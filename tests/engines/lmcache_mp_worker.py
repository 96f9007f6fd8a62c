"""The second process of tests/engines/test_lmcache_mp.py: its own LMCache MP `StorageManager`
with Cellar as L2 prefetches chunks another process stored, checks them byte for byte and
prints one JSON line: {"hits": .., "l2_hits": .., "exact": ..}.

    python lmcache_mp_worker.py <master> <count> <seed>
"""

from __future__ import annotations

import json
import sys

import lmcache_mp_kit as kit


def main(argv: list[str]) -> int:
    master, count, seed = argv[0], int(argv[1]), int(argv[2])
    node = kit.Node(master, transport="tcp")
    try:
        keys = kit.keys_for(count, seed)
        got = node.prefetch(keys)
        exact = node.read(keys, got)
        print(json.dumps({"hits": got.hits, "l2_hits": got.l2_hits, "exact": exact}), flush=True)
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
