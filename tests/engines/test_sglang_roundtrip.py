"""SGLang's real HiCacheController backs host-pool pages up into Cellar and prefetches them
back byte-exact after the host pool is wiped, for each layout, MHA and MLA (tp 1, in-process)."""

from __future__ import annotations

import pytest
from sglang_harness import Engine, Shape

from cellar.integrations.sglang import CellarHiCacheStorage

LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_backup_wipe_prefetch_is_byte_exact(cluster, layout: str, mla: bool) -> None:
    engine = Engine(cluster.address, model=f"rt-{layout}-{mla}", shape=Shape(layout=layout, mla=mla))
    try:
        assert isinstance(engine.backend, CellarHiCacheStorage)  # loaded by SGLang's factory
        pages, seed = 12, 7
        assert engine.backup(pages, seed) == pages * engine.shape.page_size
        engine.wipe()
        got = engine.prefetch(pages, seed)
        assert got.hit_pages == pages
        assert got.completed_pages == pages
        assert engine.exact_pages(got.host_indices, seed, pages) == pages
    finally:
        engine.close()
