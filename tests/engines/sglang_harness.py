"""Drive SGLang's real HiCache storage path on CPU, the way its scheduler does, with Cellar as L3.

`Engine` builds SGLang 0.5.23's own objects: a device KV pool (`MHATokenToKVPool` or
`MLATokenToKVPool`), its `PagedTokenToKVPoolAllocator`, the host pool
(`MHATokenToKVPoolHost` / `MLATokenToKVPoolHost`, any of the three layouts) and a real
`HiCacheController` whose storage backend SGLang's factory creates from the `dynamic` config
(so `cellar.integrations.sglang.CellarHiCacheStorage` is loaded by module path). Its threads do
the work: `backup` queues `write_storage` and waits for the backup ack; `prefetch` queues
`prefetch`, lets the prefetch thread run `batch_exists` and the rank MIN-reduce, allocates the
host pages as the radix cache does, hands the operation to the IO thread (`batch_get_v1`) and
gathers its acks; under the `timeout` policy it terminates the operation when the budget runs
out, as `_can_terminate_prefetch` does. Only the radix tree and the GPU are absent.

Page contents are a pure function of (seed, page number, rank), so a process that did not write
them can check that the bytes it prefetched are exact (`expected_page`).

Used by tests/engines/test_sglang_*.py, by `sglang_worker.py` (tp ranks and second instances in
their own processes) and by bench/engines_sglang.py.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from queue import Empty
from typing import Any

import torch
import torch.distributed as dist
from sglang.srt.runtime_context import get_parallel

from cellar.devtools.ports import free_port

# No "interface_v1": the backend defaults it to 1 (the zero-copy path), as users now launch it.
BACKEND_CONFIG = {"backend_name": "cellar", "module_path": "cellar.integrations.sglang",
                  "class_name": "CellarHiCacheStorage"}
ACK_WAIT_S = 120.0  # bound on any wait for a controller thread (a hang fails, never blocks CI)


def init_distributed(rank: int = 0, world_size: int = 1, port: int | None = None) -> None:
    """The gloo group HiCacheController reduces over (size 1 in-process, or real ranks)."""
    if dist.is_initialized():
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port or free_port())
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    get_parallel().override_permanently(tp_rank=rank, tp_size=world_size, pp_rank=0, pp_size=1,
                                        attn_dcp_size=1, attn_dcp_rank=0)


@dataclass
class Shape:
    layout: str = "page_first"
    mla: bool = False
    dtype: str = "bfloat16"
    page_size: int = 16
    layers: int = 4
    heads: int = 2
    head_dim: int = 32
    kv_lora_rank: int = 48  # MLA: kv_cache_dim = kv_lora_rank + qk_rope_head_dim
    qk_rope_head_dim: int = 16
    device_tokens: int = 1024
    host_ratio: float = 4.0


@dataclass
class PrefetchResult:
    hit_pages: int  # what batch_exists (rank-reduced) promised
    completed_pages: int  # what batch_get_v1 filled (rank-reduced), as the scheduler sees it
    host_indices: Any = None
    terminated: bool = False
    seconds: float = 0.0


@dataclass
class Engine:
    address: str
    model: str = "cellar-test/model"
    shape: Shape = field(default_factory=Shape)
    tenant: str = "default"
    extra: dict[str, Any] = field(default_factory=dict)
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        from sglang.srt.managers.cache_controller import HiCacheController
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

        init_distributed()
        s = self.shape
        dtype = getattr(torch, s.dtype)
        if s.mla:
            self.device_pool = MLATokenToKVPool(
                s.device_tokens, s.page_size, dtype, s.kv_lora_rank, s.qk_rope_head_dim,
                s.layers, "cpu", False, start_layer=0, end_layer=s.layers)
        else:
            self.device_pool = MHATokenToKVPool(
                s.device_tokens, s.page_size, dtype, s.heads, s.head_dim, s.layers, "cpu",
                False, start_layer=0, end_layer=s.layers)
        pool = self.device_pool
        self.allocator = PagedTokenToKVPoolAllocator(s.device_tokens, s.page_size, dtype, "cpu",
                                                     pool, False)
        info = pool.get_device_pool_infos()[0].buffer_info
        common = dict(pin_memory=False, device_capacity_tokens=pool.size,
                      start_layer=pool.start_layer, end_layer=pool.end_layer)
        if s.mla:
            self.host = MLATokenToKVPoolHost(info, s.host_ratio, 0, s.page_size, s.layout,
                                             target_layer_num=pool.layer_num,
                                             override_kv_cache_dim=pool.kv_cache_dim, **common)
        else:
            self.host = MHATokenToKVPoolHost(info, s.host_ratio, 0, s.page_size, s.layout,
                                             write_back_staging=pool.hicache_write_back_staging,
                                             **common)
        config = {**BACKEND_CONFIG, "master": self.address, "tenant": self.tenant, **self.extra}
        self.controller = HiCacheController(
            self.allocator, self.host, s.page_size, dist.group.WORLD, threading.Event(),
            write_policy="write_through", storage_backend="dynamic", model_name=self.model,
            storage_backend_extra_config=config)
        self.backend = self.controller.storage_backend
        self.last_backup_s = 0.0

    # ---- data ---------------------------------------------------------------------------

    def tokens(self, pages: int, seed: int) -> list[int]:
        """Token ids of a sequence of `pages` pages (its page hashes are SGLang's)."""
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 50_000, (pages * self.shape.page_size,), generator=g).tolist()

    def page_hashes(self, tokens: list[int]) -> list[str]:
        from sglang.srt.mem_cache.utils import get_storage_hash_str

        return list(get_storage_hash_str(tokens, None, page_size=self.shape.page_size))

    def expected_page(self, seed: int, page: int) -> torch.Tensor:
        """Flat page content (pool dtype) for page `page` of sequence `seed` on this rank."""
        rank = 0 if self.shape.mla else self.rank  # MLA ranks hold the same KV
        g = torch.Generator().manual_seed(seed * 1_000_003 + page * 131 + rank)
        flat = self.host.get_dummy_flat_data_page()
        raw = torch.randint(0, 256, (flat.numel() * flat.element_size(),), dtype=torch.uint8,
                            generator=g)
        return raw.view(flat.dtype)

    def fill(self, host_indices: Any, seed: int, pages: int) -> None:
        p = self.shape.page_size
        for i in range(pages):
            self.host.set_from_flat_data_page(int(host_indices[i * p]), self.expected_page(seed, i))

    def exact_pages(self, host_indices: Any, seed: int, pages: int) -> int:
        """How many of the first `pages` pages at `host_indices` hold exactly their bytes."""
        p = self.shape.page_size
        for i in range(pages):
            got = self.host.get_data_page(int(host_indices[i * p])).contiguous()
            if not torch.equal(got.view(torch.uint8), self.expected_page(seed, i).view(torch.uint8)):
                return i
        return pages

    def wipe(self, fill: int = 0) -> None:
        """Forget the host pool: set every byte of it to `fill` and free every page."""
        self.host.kv_buffer.view(torch.uint8).fill_(fill)
        self.host.clear()

    # ---- the controller's storage path ----------------------------------------------------

    def backup(self, pages: int, seed: int, *, first: int | None = None) -> int:
        """Fill host pages with sequence `seed` (its first `first` pages of `pages`, default
        all), back them up through the controller; the tokens it stored."""
        tokens = self.tokens(pages, seed)[:(pages if first is None else first) * self.shape.page_size]
        pages = len(tokens) // self.shape.page_size
        host_indices = self.host.alloc(len(tokens))
        assert host_indices is not None, "host pool too small for the test"
        self.fill(host_indices, seed, pages)
        hashes = self.page_hashes(tokens)
        started = time.monotonic()
        op_id = self.controller.write_storage(host_indices, tokens, hash_value=hashes)
        deadline = time.monotonic() + ACK_WAIT_S
        while time.monotonic() < deadline:
            try:
                op = self.controller.ack_backup_queue.get(timeout=1)
            except Empty:
                continue
            if op.id == op_id:
                self.last_backup_s = time.monotonic() - started  # queue -> ack (bench/engines)
                self.host.free(host_indices)
                return int(op.completed_tokens)
        raise TimeoutError("no backup ack")

    def prefetch(self, pages: int, seed: int, *, policy: str = "wait_complete",
                 timeout_s: float | None = None) -> PrefetchResult:
        """Prefetch sequence `seed` from storage into fresh host pages, as the scheduler does."""
        c = self.controller
        started = time.monotonic()
        tokens = self.tokens(pages, seed)
        rid = uuid.uuid4().hex
        c.prefetch(rid, tokens)
        op = _take(c.prefetch_hit_queue, lambda o: o.request_id == rid)
        hit_pages = len(op.hash_value)
        if hit_pages == 0:
            return PrefetchResult(0, 0, seconds=time.monotonic() - started)
        op.host_indices = c.alloc_prefetch_host_buffers(op, hit_pages * self.shape.page_size)
        assert op.host_indices is not None, "host pool too small for the test"
        c.prefetch_buffer.put(op)
        completed, terminated = 0, False
        assert policy in ("wait_complete", "timeout"), policy
        deadline = time.monotonic() + ACK_WAIT_S
        while time.monotonic() < deadline:
            if policy == "timeout" and timeout_s is not None and \
                    time.monotonic() - started > timeout_s:
                # _can_terminate_prefetch said yes: the scheduler takes what has been acked.
                completed, _ = c.terminate_prefetch(op)
                terminated = True
                break
            try:
                ack = c.ack_prefetch_queue.get(timeout=0.01)
            except Empty:
                continue
            if ack.operation is not op:
                continue
            if ack.completed_tokens is not None:
                completed = op.completed_tokens = ack.completed_tokens
            if ack.completed_req:
                break
        else:
            raise TimeoutError("no prefetch completion ack")
        return PrefetchResult(hit_pages, completed // self.shape.page_size, op.host_indices,
                              terminated, time.monotonic() - started)

    def close(self) -> None:
        self.controller.detach_storage_backend()


def _take(queue: Any, match: Any) -> Any:
    deadline = time.monotonic() + ACK_WAIT_S
    while time.monotonic() < deadline:
        try:
            item = queue.get(timeout=1)
        except Empty:
            continue
        if match(item):
            return item
    raise TimeoutError("controller thread did not answer")
