"""What the LMCache engine tests and bench share: a real `LMCacheEngine` on CPU through
`plugin://cellar`, configured by the same YAML that docs/engines-lmcache.md tells users to copy.

The only piece that is not LMCache's own is `CPUKVConnector`, the engine side of LMCache's
`GPUConnectorInterface` (vLLM's paged GPU memory in production): on this CPU machine the
"engine KV" is one CPU tensor per request, [2, layers, tokens, hidden], and the connector copies
chunks between it and LMCache's MemoryObjs exactly as the GPU connector does between the paged
KV and the MemoryObjs. Everything between the MemoryObjs and Cellar is LMCache's code (cache
engine, storage manager, LocalCPUBackend, RemoteBackend, connector manager) and ours.
"""

from __future__ import annotations

import gc
import uuid
from pathlib import Path
from typing import Any

import torch
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.metadata import LMCacheMetadata

# A small model shape: 4 layers, 2 KV heads of 64, chunks of 16 tokens: 32 KiB per chunk in
# bfloat16. The bench passes its own shape.
LAYERS = 4
KV_HEADS = 2
HEAD_DIM = 64
CHUNK_TOKENS = 16
DTYPE = torch.bfloat16
MODEL = "cellar-test/tiny-kv"
DROP_LOCAL_WAIT_S = 60.0

CONFIG_YAML = """\
chunk_size: {chunk}
local_cpu: true
max_local_cpu_size: {cpu_gib}
save_unfull_chunk: true
blocking_timeout_secs: {blocking_s}
remote_serde: naive
remote_storage_plugins: ["cellar"]
extra_config:
  remote_storage_plugin.cellar.module_path: cellar.integrations.lmcache
  remote_storage_plugin.cellar.class_name: {class_name}
  remote_storage_plugin.cellar.master: "{master}"
  remote_storage_plugin.cellar.timeout_s: {timeout_s}
  remote_storage_plugin.cellar.transport: {transport}
  save_chunk_meta: {save_chunk_meta}
"""


class CPUKVConnector(GPUConnectorInterface):
    """Copies chunks between a CPU KV tensor (kwarg `kv`, [2, layers, tokens, hidden]) and
    LMCache MemoryObjs of the KV_2LTD format."""

    def __init__(self, layers: int, hidden: int, dtype: torch.dtype) -> None:
        self.layers, self.hidden, self.dtype = layers, hidden, dtype

    def from_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs: Any) -> None:
        kv: torch.Tensor = kwargs["kv"]
        dest = memory_obj.tensor
        assert dest is not None and dest.shape == (2, self.layers, end - start, self.hidden)
        dest.copy_(kv[:, :, start:end, :])

    def to_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs: Any) -> None:
        kv: torch.Tensor = kwargs["kv"]
        src = memory_obj.tensor
        assert src is not None
        kv[:, :, start:end, :].copy_(src)

    def batched_from_gpu(self, memory_objs: Any, starts: list[int], ends: list[int],
                         **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs: Any = None, starts: Any = None, ends: Any = None,
                       **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, start, end, **kwargs)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.layers, num_tokens, self.hidden])


def write_config(path: Path, master: str, *, save_chunk_meta: bool = False,
                 chunk: int = CHUNK_TOKENS, cpu_gib: float = 0.25, timeout_s: float = 5.0,
                 blocking_s: int = 10, transport: str = "auto",
                 class_name: str = "CellarConnectorAdapter") -> Path:
    path.write_text(CONFIG_YAML.format(master=master, chunk=chunk, cpu_gib=cpu_gib,
                                       timeout_s=timeout_s, blocking_s=blocking_s, transport=transport,
                                       class_name=class_name,
                                       save_chunk_meta=str(save_chunk_meta).lower()))
    return path


def make_engine(config_path: Path, *, layers: int = LAYERS, kv_heads: int = KV_HEADS,
                head_dim: int = HEAD_DIM, chunk: int = CHUNK_TOKENS, dtype: torch.dtype = DTYPE,
                model: str = MODEL, world_size: int = 1, worker_id: int = 0) -> LMCacheEngine:
    """A post-initialised LMCacheEngine whose storage manager holds LocalCPUBackend and the
    RemoteBackend of plugin `cellar` (built by LMCache from the config file)."""
    config = LMCacheEngineConfig.from_file(str(config_path))
    metadata = LMCacheMetadata(
        model_name=model, world_size=world_size, local_world_size=world_size,
        worker_id=worker_id, local_worker_id=worker_id, kv_dtype=dtype,
        kv_shape=(layers, 2, chunk, kv_heads, head_dim), chunk_size=chunk)
    connector = CPUKVConnector(layers, kv_heads * head_dim, dtype)
    engine = LMCacheEngineBuilder.get_or_create(
        f"cellar-test-{uuid.uuid4().hex[:8]}", config, metadata, connector,
        lambda t, r: None, lambda o, r: o)
    engine.post_init()
    return engine


def destroy(engine: LMCacheEngine) -> None:
    for instance_id, inst in list(LMCacheEngineBuilder._instances.items()):
        if inst is engine:
            LMCacheEngineBuilder.destroy(instance_id)
    gc.collect()


def remote_backend(engine: LMCacheEngine) -> Any:
    """LMCache's RemoteBackend for plugin `cellar` inside the engine's storage manager."""
    assert engine.storage_manager is not None
    return engine.storage_manager.storage_backends["RemoteBackend-cellar"]


def cellar_connector(engine: LMCacheEngine) -> Any:
    """Our CellarConnector under LMCache's instrumentation wrapper."""
    return remote_backend(engine).connection.getWrappedConnector()


def drop_local(engine: LMCacheEngine) -> None:
    """Empty the engine's LocalCPUBackend so the next retrieve must come from Cellar."""
    assert engine.storage_manager is not None
    import time

    local = engine.storage_manager.storage_backends["LocalCPUBackend"]
    # A chunk whose remote put is still under way is referenced and cannot go yet: wait for it
    # (bounded), so a retrieve after this can only be served by Cellar.
    deadline = time.monotonic() + DROP_LOCAL_WAIT_S
    while True:
        local.clear()
        held = local.get_keys()
        if not held:
            return
        assert time.monotonic() < deadline, f"LocalCPUBackend still holds {len(held)} chunks"
        time.sleep(0.05)


def random_kv(tokens: int, *, seed: int, layers: int = LAYERS,
              hidden: int = KV_HEADS * HEAD_DIM, dtype: torch.dtype = DTYPE) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, layers, tokens, hidden, generator=gen).to(dtype)


def tokens_for(count: int, *, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (count,), generator=gen)


def wait_until(cond: Any, what: str, timeout_s: float = 60.0) -> None:
    """Poll `cond` (bounded, never a fixed sleep) until it holds; AssertionError after."""
    import time

    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def wait_stored(engine: LMCacheEngine, tokens: torch.Tensor, timeout_s: float = 30.0) -> int:
    """Wait (bounded) until Cellar holds every chunk of `tokens` the engine stored (remote puts
    are asynchronous in LMCache); returns the prefix Cellar reports, in tokens."""
    import time

    backend = remote_backend(engine)
    deadline = time.monotonic() + timeout_s
    keys = [key for _s, _e, key in engine.token_database.process_tokens(tokens)]
    while True:
        hit = backend.batched_contains(keys)
        if hit == len(keys) or time.monotonic() > deadline:
            return hit
        time.sleep(0.05)


def prompt(prefix_tokens: int, suffix_tokens: int, *, suffix_seed: int) -> torch.Tensor:
    """A prompt of a shared prefix (the same in every process) and a suffix of its own."""
    return torch.cat([tokens_for(prefix_tokens, seed=1), tokens_for(suffix_tokens, seed=suffix_seed)])


def _main(argv: list[str]) -> int:
    """`store CONFIG PREFIX SUFFIX SEED` or `retrieve CONFIG PREFIX SUFFIX SEED OUT`: one engine in
    this process (the two-instance test runs two of them); KV is random_kv(seed=SEED)."""
    import json

    command, config, prefix, suffix, seed = argv[:5]
    engine = make_engine(Path(config))
    tokens = prompt(int(prefix), int(suffix), suffix_seed=int(seed))
    try:
        if command == "store":
            engine.store(tokens, kv=random_kv(len(tokens), seed=int(seed)))
            print(json.dumps({"stored_chunks": wait_stored(engine, tokens)}), flush=True)
        else:
            hit = engine.lookup(tokens)
            kv = torch.zeros(2, LAYERS, len(tokens), KV_HEADS * HEAD_DIM, dtype=DTYPE)
            mask = engine.retrieve(tokens, kv=kv)
            torch.save({"kv": kv, "mask": mask}, argv[5])
            print(json.dumps({"lookup_tokens": hit, "retrieved_tokens": int(mask.sum())}),
                  flush=True)
    finally:
        destroy(engine)
    return 0


__all__ = ["CONFIG_YAML", "CPUKVConnector", "cellar_connector", "destroy", "drop_local",
           "make_engine", "prompt", "random_kv", "remote_backend", "tokens_for", "wait_stored", "wait_until", "write_config"]


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
