"""What SGLang sees of Cellar's work, through its real HiCacheController: `get_stats()` reports
the pages each backup and prefetch moved since the last call, on both interfaces, and a launch
whose extra config leaves `interface_v1` out takes the zero-copy v1 path (an explicit 0 keeps
the generic one)."""

from __future__ import annotations

import pytest
from sglang_harness import BACKEND_CONFIG, Engine, Shape


def test_interface_v1_defaults_to_zero_copy(cluster) -> None:
    assert "interface_v1" not in BACKEND_CONFIG  # launched as the docs now say
    engine = Engine(cluster.address, model="stats-default", shape=Shape())
    try:
        c = engine.controller
        assert c.page_get_func == c._page_get_zero_copy
        assert c.page_set_func == c._page_set_zero_copy
        assert c.storage_config.extra_config["interface_v1"] == 1
        calls: list[int] = []
        real = engine.backend.batch_get_v1

        def counted(keys: list[str], *args: object, **kwargs: object) -> list[bool]:
            calls.append(len(keys))
            return real(keys, *args, **kwargs)

        engine.backend.batch_get_v1 = counted
        pages = 4
        assert engine.backup(pages, 81) == pages * engine.shape.page_size
        engine.wipe()
        got = engine.prefetch(pages, 81)
        assert got.completed_pages == pages and sum(calls) == pages
        assert engine.exact_pages(got.host_indices, 81, pages) == pages
    finally:
        engine.close()


def test_explicit_zero_keeps_the_generic_path(cluster) -> None:
    engine = Engine(cluster.address, model="stats-generic", shape=Shape(),
                    extra={"interface_v1": 0})
    try:
        c = engine.controller
        assert c.page_get_func == c._generic_page_get
        assert c.storage_config.extra_config["interface_v1"] == 0
    finally:
        engine.close()


@pytest.mark.parametrize("v1", [1, 0], ids=["v1", "generic"])
def test_get_stats_reports_the_pages_moved_since_the_last_call(cluster, v1: int) -> None:
    engine = Engine(cluster.address, model=f"stats-moved-{v1}", shape=Shape(),
                    extra={"interface_v1": v1})
    try:
        backend = engine.backend
        backend.get_stats()  # whatever registration did
        assert engine.backup(6, 91) == 6 * engine.shape.page_size
        assert engine.backup(3, 92) == 3 * engine.shape.page_size
        first = backend.get_stats()
        assert sum(first.backup_pgs) == 9 and first.prefetch_pgs == []
        assert len(first.backup_bandwidth) == len(first.backup_pgs)
        assert all(bw > 0 for bw in first.backup_bandwidth)

        engine.wipe()
        assert engine.prefetch(6, 91).completed_pages == 6
        second = backend.get_stats()
        assert second.backup_pgs == [] and sum(second.prefetch_pgs) == 6
        assert len(second.prefetch_bandwidth) == len(second.prefetch_pgs)
        assert all(bw > 0 for bw in second.prefetch_bandwidth)

        assert engine.prefetch(5, 93).hit_pages == 0  # a miss moves nothing: no sample
        third = backend.get_stats()
        assert third.prefetch_pgs == [] and third.backup_pgs == []
    finally:
        engine.close()
