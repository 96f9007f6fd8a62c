"""LMCache's own LMCacheEngine over a node whose DRAM (1 MiB) is a quarter of the working set
(8 prompts x 16 chunks of 32 KiB = 4 MiB), its local CPU backend emptied so every chunk must
come from Cellar: with a disk tier under the DRAM every token comes back byte-exact; with
DRAM alone (the negative control) most are evicted. The test prints both counts."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lmcache")

import lmcache_kit as kit  # noqa: E402
import torch  # noqa: E402

from cellar.devtools.local_cluster import LocalCluster  # noqa: E402

PROMPTS = range(201, 209)
TOKENS = 16 * kit.CHUNK_TOKENS


def _tokens_back(cluster: LocalCluster, config: Path) -> tuple[int, int]:
    """(tokens retrieved, of which byte-exact) after storing every prompt."""
    engine = kit.make_engine(kit.write_config(config, cluster.address), model="test/disk-tier")
    try:
        for seed in PROMPTS:
            tokens = kit.tokens_for(TOKENS, seed=seed)
            engine.store(tokens, kv=kit.random_kv(TOKENS, seed=seed + 1000))
            kit.wait_stored(engine, tokens)
        kit.drop_local(engine)
        back = exact = 0
        for seed in PROMPTS:
            kv = kit.random_kv(TOKENS, seed=seed + 1000)
            out = torch.zeros_like(kv)
            got = int(engine.retrieve(kit.tokens_for(TOKENS, seed=seed), kv=out).sum())
            back += got
            exact += got if torch.equal(out[:, :, :got], kv[:, :, :got]) else 0
        return back, exact
    finally:
        kit.destroy(engine)


def test_lmcache_retrieves_more_with_a_disk_tier_byte_exact(tmp_path: Path, tier_cluster) -> None:  # type: ignore[no-untyped-def]
    dram_back, dram_exact = _tokens_back(tier_cluster(disk=False), tmp_path / "dram.yaml")
    disk_back, disk_exact = _tokens_back(tier_cluster(disk=True), tmp_path / "disk.yaml")
    total = len(PROMPTS) * TOKENS
    print(f"\nLMCache, {total} tokens in {total // kit.CHUNK_TOKENS} chunks of 32 KiB over 1 MiB "
          f"DRAM: {dram_back} tokens back with DRAM alone, {disk_back} with DRAM + disk")
    assert (dram_exact, disk_exact) == (dram_back, disk_back)
    assert disk_back == total
    assert dram_back < total // 2
