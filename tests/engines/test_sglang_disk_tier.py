"""SGLang's real HiCacheController over a node whose DRAM (1 MiB) is a quarter of the working
set (8 sequences x 32 pages of 16 KiB = 4 MiB): with a disk tier under it every page comes back
byte-exact; with DRAM alone (the negative control, same cluster shape without --disk-dir) most
are evicted. The test prints both counts (docs/disk-tier.md)."""

from __future__ import annotations

from sglang_harness import Engine, Shape

from cellar.devtools.local_cluster import LocalCluster

SEQUENCES = range(101, 109)
PAGES = 32


def _pages_back(cluster: LocalCluster) -> tuple[int, int]:
    """(pages prefetched back, of which byte-exact) after backing up every sequence."""
    engine = Engine(cluster.address, model="disk-tier", shape=Shape())
    try:
        for seed in SEQUENCES:
            assert engine.backup(PAGES, seed) == PAGES * engine.shape.page_size
        back = exact = 0
        for seed in SEQUENCES:
            engine.wipe()
            got = engine.prefetch(PAGES, seed)
            back += got.completed_pages
            if got.completed_pages:
                exact += engine.exact_pages(got.host_indices, seed, got.completed_pages)
        return back, exact
    finally:
        engine.close()


def test_sglang_prefetches_more_pages_with_a_disk_tier_byte_exact(tier_cluster) -> None:  # type: ignore[no-untyped-def]
    dram_back, dram_exact = _pages_back(tier_cluster(disk=False))
    disk_back, disk_exact = _pages_back(tier_cluster(disk=True))
    total = len(SEQUENCES) * PAGES
    print(f"\nSGLang HiCache, {total} pages of 16 KiB over 1 MiB DRAM: {dram_back} pages back "
          f"with DRAM alone, {disk_back} with DRAM + disk")
    assert (dram_exact, disk_exact) == (dram_back, disk_back)  # every page back is byte-exact
    assert disk_back == total
    assert dram_back < total // 2
