"""What the LMCache multiprocess (MP) mode tests share: LMCache 0.5.6's own `StorageManager` (the
L1 manager, its store and prefetch controllers and the L2 adapters, as `lmcache server` runs
them) built from the very command-line lines docs/engines-lmcache.md tells users to copy, with
Cellar loaded as a `plugin` L2 adapter by configuration only.

`Node` drives it as MP mode's engine side does: `store` reserves L1 objects, fills them and
finishes the write (the store controller then pushes them to L2); `drop_l1` forgets them in L1;
`prefetch` submits a prefetch task (L1 lookup, L2 lookup and lock, L2 load into L1, as
LMCache's prefetch controller does it) and `read` checks the loaded bytes and releases the read
locks. Chunk contents are a pure function of (seed, index), so another process can check them.

Used by tests/engines/test_lmcache_mp*.py and by `lmcache_mp_worker.py` (the second process).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import torch
from lmcache.v1.distributed.api import (
    GroupedObjectKeys,
    MemoryLayoutDesc,
    ObjectKey,
    PrefetchTaskSpec,
)
from lmcache.v1.distributed.config import parse_args
from lmcache.v1.distributed.storage_manager import StorageManager

from cellar.integrations.lmcache.l2_adapter import CellarL2Adapter

MODEL = "cellar-test/mp-tiny"
# [K/V, layers, tokens, hidden] of one chunk: 8 KiB in bfloat16, so 1,000 chunks fit a small L1.
SHAPE = (2, 2, 16, 64)
DTYPE = torch.bfloat16
WAIT_S = 90.0


def adapter_json(master: str, **params: Any) -> str:
    """The `--l2-adapter` value of docs/engines-lmcache.md (MP mode)."""
    return json.dumps({"type": "plugin", "module_path": "cellar.integrations.lmcache.l2_adapter",
                       "class_name": "CellarL2Adapter",
                       "adapter_params": {"master": master, **params}})


def layout(dtype: torch.dtype = DTYPE, shape: tuple[int, ...] = SHAPE) -> MemoryLayoutDesc:
    return MemoryLayoutDesc(shapes=[torch.Size(shape)], dtypes=[dtype])


def keys_for(count: int, seed: int, *, model: str = MODEL, rank: int = 0) -> list[ObjectKey]:
    return [ObjectKey(chunk_hash=(seed * 1_000_003 + i).to_bytes(8, "big"), model_name=model,
                      kv_rank=rank) for i in range(count)]


def content(key: ObjectKey, nbytes: int) -> torch.Tensor:
    """The bytes of a chunk: a pure function of its key."""
    g = torch.Generator().manual_seed(int.from_bytes(key.chunk_hash, "big") % (1 << 62))
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def wait_until(cond: Any, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


@dataclass
class Prefetched:
    hits: int  # keys resident in L1 when the task finished (read-locked)
    l2_hits: int  # of those, loaded from L2 by this task
    owners: dict[ObjectKey, int]


class Node:
    """One MP-mode cache server's storage side, as `lmcache server` builds it."""

    def __init__(self, master: str, *, l1_gb: float = 0.05, **params: Any) -> None:
        self.argv = ["--l1-size-gb", str(l1_gb), "--eviction-policy", "LRU",
                     "--l2-adapter", adapter_json(master, **params)]
        self.manager = StorageManager(parse_args(self.argv))
        try:
            ((_, adapter),) = self.manager.l2_adapters()
            assert isinstance(adapter, CellarL2Adapter), type(adapter)  # loaded by `plugin`
        except BaseException:
            self.manager.close()
            raise
        self.adapter: CellarL2Adapter = adapter

    def store(self, keys: list[ObjectKey], desc: MemoryLayoutDesc | None = None) -> None:
        """Write chunks into L1 (the store controller then pushes them to L2)."""
        objs = self.manager.reserve_write(keys, desc or layout())
        assert len(objs) == len(keys), f"L1 reserved {len(objs)} of {len(keys)}"
        for key, obj in objs.items():
            torch.frombuffer(obj.byte_array, dtype=torch.uint8).copy_(content(key, obj.get_size()))
        self.manager.finish_write(keys)

    def wait_l2_stored(self, count: int, nbytes: int) -> None:
        wait_until(lambda: self.adapter.get_usage().total_bytes_used >= count * nbytes,
                   f"{count} chunks stored in Cellar")

    def drop_l1(self, keys: list[ObjectKey]) -> None:
        self.manager.delete_l1_keys(keys, force=True)

    def prefetch(self, keys: list[ObjectKey], desc: MemoryLayoutDesc | None = None,
                 timeout_s: float = WAIT_S) -> Prefetched:
        spec = PrefetchTaskSpec(key_groups=[GroupedObjectKeys(keys=keys, object_group_id=0,
                                                              layout_desc=desc or layout())])
        handle = self.manager.submit_prefetch_task(spec)
        assert self.manager.wait_prefetch_status(handle, timeout_s), "prefetch did not finish"
        result = self.manager.query_prefetch_status(handle)
        assert result is not None
        return Prefetched(result.hit_cells[0].popcount(), result.l2_hit_count, result.l1_owners)

    def read(self, keys: list[ObjectKey], got: Prefetched) -> int:
        """Check the leading `got.hits` chunks byte for byte and release their read locks;
        how many were exact."""
        hit = keys[:got.hits]
        exact = 0
        with self.manager.read_prefetched_results(hit, got.owners) as objs:
            assert objs is not None, "a prefetched chunk is not readable in L1"
            for key, obj in zip(hit, objs, strict=True):
                if torch.equal(torch.frombuffer(obj.byte_array, dtype=torch.uint8),
                               content(key, obj.get_size())):
                    exact += 1
        self.manager.finish_read_prefetched(hit, 1, got.owners)
        return exact

    def close(self) -> None:
        self.manager.close()


def chunk_bytes(desc: MemoryLayoutDesc | None = None) -> int:
    d = desc or layout()
    return sum(int(s.numel()) * t.itemsize for s, t in zip(d.shapes, d.dtypes, strict=True))
