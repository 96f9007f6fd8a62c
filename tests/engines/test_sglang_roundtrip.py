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


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generic_interface_shares_objects_with_v1(cluster, layout: str) -> None:
    """Without interface_v1 SGLang takes batch_set/batch_get (flat data pages); their objects
    are the v1 objects, so each path reads what the other wrote."""
    shape = Shape(layout=layout)
    generic = Engine(cluster.address, model=f"generic-{layout}", shape=shape,
                     extra={"interface_v1": 0})
    v1 = Engine(cluster.address, model=f"generic-{layout}", shape=shape)
    try:
        assert generic.controller.page_set_func == generic.controller._generic_page_set
        pages = 6
        assert generic.backup(pages, 61) == pages * 16
        assert v1.backup(pages, 62) == pages * 16
        for reader, seed in ((v1, 61), (generic, 62), (generic, 61)):
            reader.wipe()
            got = reader.prefetch(pages, seed)
            assert got.completed_pages == pages
            assert reader.exact_pages(got.host_indices, seed, pages) == pages
    finally:
        generic.close()
        v1.close()


def test_stats_exists_and_clear(cluster) -> None:
    engine = Engine(cluster.address, model="stats", shape=Shape())
    try:
        pages = 5
        engine.backup(pages, 71)
        engine.wipe()
        engine.prefetch(pages, 71)
        stats = engine.backend.get_stats()
        assert sum(stats.backup_pgs) == pages and sum(stats.prefetch_pgs) == pages
        assert all(bw > 0 for bw in stats.backup_bandwidth + stats.prefetch_bandwidth)
        assert engine.backend.get_stats().prefetch_pgs == []  # drained by the read
        hashes = engine.page_hashes(engine.tokens(pages, 71))
        assert engine.backend.batch_exists(hashes) == pages
        assert engine.backend.exists(hashes[0])
        engine.backend.clear()
        assert engine.backend.batch_exists(hashes) == 0
        assert engine.prefetch(pages, 71).hit_pages == 0
    finally:
        engine.close()


def test_missing_master_is_a_configuration_error() -> None:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    import cellar

    config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                  attn_cp_size=1, is_mla_model=False,
                                  enable_storage_metrics=False, is_page_first_layout=True,
                                  model_name="m", extra_config={
                                      "backend_name": "cellar",
                                      "module_path": "cellar.integrations.sglang",
                                      "class_name": "CellarHiCacheStorage"})
    with pytest.raises(cellar.InvalidArgument, match="master"):
        StorageBackendFactory.create_backend("dynamic", config, None)


def test_deadline_follows_sglangs_timeout_policy(monkeypatch: pytest.MonkeyPatch, cluster) -> None:
    """In a launched server the backend reads SGLang's own timeout-policy budget (its published
    memory config, parsed by SGLang's parser); here that config is stood in for."""
    import types

    import sglang.srt.runtime_context as runtime

    from cellar.integrations import sglang as adapter

    memory = types.SimpleNamespace(
        hicache_storage_prefetch_policy="timeout",
        hicache_storage_backend_extra_config='{"prefetch_timeout_base": 2, '
                                             '"prefetch_timeout_per_ki_token": 0.5}')
    monkeypatch.setattr(runtime, "get_memory", lambda: memory)
    assert adapter.sglang_timeout_policy() == (2 * 0.9, 0.5 * 0.9)
    engine = Engine(cluster.address, model="policy-follow", shape=Shape())
    try:
        assert engine.backend.settings["get_timeout_base_s"] == pytest.approx(1.8)
        explicit = Engine(cluster.address, model="policy-follow", shape=Shape(),
                          extra={"get_timeout_base_s": 0.5})
        assert explicit.backend.settings["get_timeout_base_s"] == 0.5
        explicit.close()
    finally:
        engine.close()
    memory.hicache_storage_prefetch_policy = "wait_complete"
    assert adapter.sglang_timeout_policy() is None


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pool_pages_line_matches_sglangs_own_meta(cluster, layout: str, mla: bool) -> None:
    """The adapter computes a batch's part pointers from the line it learned at registration;
    for scattered, unordered pages of the real host pool they are the pointers SGLang's own
    `get_page_buffer_meta` gives, and a pool whose meta is not linear is asked every time."""
    import torch

    engine = Engine(cluster.address, model=f"line-{layout}-{mla}",
                    shape=Shape(layout=layout, mla=mla))
    try:
        pages = engine.backend.pages
        assert pages._linear is not None  # every supported pool is linear
        p = pages.page_size_tokens
        chosen = [5, 0, 17, 3, pages.pool.size // p - 1]
        idx = torch.tensor([q * p + t for q in chosen for t in range(p)], dtype=torch.int64)
        ptrs, _ = pages.pool.get_page_buffer_meta(idx)
        want = [int(x) - pages.base_ptr for x in ptrs]
        assert pages._part_offsets(idx) == want

        real = pages.pool.get_page_buffer_meta

        def bent(indices):  # a pool whose page 1 sits one token further than the line says
            got, sizes = real(indices)
            if int(indices[0]) == p:
                got = [int(x) + 2 for x in got]
            return got, sizes

        pages.pool.get_page_buffer_meta = bent
        try:
            assert pages._learn_linear(real(pages._token_indices([0]))[0]) is None
        finally:
            pages.pool.get_page_buffer_meta = real
    finally:
        engine.close()
