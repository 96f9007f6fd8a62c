"""The format guard inside SGLang's prefetch: an object under one of the reader's keys whose size
is not the format's (shorter or longer) is refused, and none of its bytes is left in the host
pool; the pages before it are served. (The page may be cleared rather than untouched: this
client put the key's previous object over shm, so its get reads that allocation's range early,
and an early read the reply does not confirm is zeroed, client/early_reads.py.)"""

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
        held = page.view(torch.uint8)
        assert bool(((held == SENTINEL) | (held == 0)).all())  # untouched or cleared, never 0x11
    finally:
        engine.close()


def test_page_part_outside_the_host_pool_is_refused(cluster, monkeypatch) -> None:
    """A page pointer outside the registered pool (a broken SGLang invariant, or host indices
    past the pool's end) is never turned into a view: the backup and the prefetch of that batch
    are refused, nothing is stored. Both ways of finding the pointers are covered: the line the
    adapter learned at registration, and asking SGLang per batch (its meta not linear)."""
    engine = Engine(cluster.address, model="guard-ptr", shape=Shape(layout="layer_first"))
    try:
        pool, backend = engine.host, engine.backend
        pages = backend.pages
        assert pages._linear is not None
        hashes = engine.page_hashes(engine.tokens(2, SEED))
        p = pages.page_size_tokens
        past_the_end = pool.size // p  # the first page the pool does not have
        beyond = torch.arange(past_the_end * p - p, past_the_end * p + p, dtype=torch.int64)
        assert backend.batch_set_v1(hashes, beyond) == [False, False]
        assert backend.batch_get_v1(hashes, beyond) == [False, False]

        real_meta = pool.get_page_buffer_meta

        def meta_past_the_end(indices):
            ptrs, sizes = real_meta(indices)
            ptrs = list(ptrs)
            ptrs[-1] = pages.base_ptr + pages.raw.nbytes  # one part too far
            return ptrs, sizes

        indices = torch.arange(0, 2 * p, dtype=torch.int64)
        monkeypatch.setattr(pages, "_linear", None)  # SGLang is asked for every batch
        monkeypatch.setattr(pool, "get_page_buffer_meta", meta_past_the_end)
        assert backend.batch_set_v1(hashes, indices) == [False, False]
        assert backend.batch_get_v1(hashes, indices) == [False, False]
        monkeypatch.setattr(pool, "get_page_buffer_meta", real_meta)
        assert backend.batch_exists(hashes) == 0  # nothing was stored
        assert backend.batch_set_v1(hashes, indices) == [True, True]  # the real meta works
        assert backend.batch_exists(hashes) == 2
    finally:
        engine.close()
