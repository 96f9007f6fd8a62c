"""The format guard inside SGLang's prefetch: an object under one of the reader's keys whose size
is not the format's (shorter or longer) is refused before any byte of it reaches the host pool;
the pages before it are served."""

from __future__ import annotations

import pytest
import torch
from sglang_harness import Engine, Shape

import cellar

PAGES, BAD_PAGE, SEED, SENTINEL = 8, 3, 51, 0xAB


@pytest.mark.parametrize("delta", [-64, +64], ids=["shorter", "longer"])
def test_object_of_another_size_never_reaches_the_pool(cluster, delta: int) -> None:
    engine = Engine(cluster.address, model=f"guard{delta}", shape=Shape(layout="layer_first"))
    try:
        assert engine.backup(PAGES, SEED) == PAGES * 16
        keys = engine.backend.object_keys(engine.page_hashes(engine.tokens(PAGES, SEED)))
        bad_key = keys[2 * BAD_PAGE]  # page 3's K object
        size = engine.backend.pages.geometry.object_bytes
        with cellar.connect(cluster.address) as c:
            assert c.remove(bad_key)
            c.put(bad_key, b"\x11" * (size + delta))
        engine.wipe(fill=SENTINEL)
        got = engine.prefetch(PAGES, SEED)
        assert got.hit_pages == PAGES  # it exists...
        assert got.completed_pages == BAD_PAGE  # ...but is refused: the prefix stops there
        assert engine.exact_pages(got.host_indices, SEED, BAD_PAGE) == BAD_PAGE
        page = engine.host.get_data_page(int(got.host_indices[BAD_PAGE * 16])).contiguous()
        assert bool((page.view(torch.uint8) == SENTINEL).all())  # untouched
    finally:
        engine.close()
