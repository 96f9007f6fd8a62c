"""SGLang 0.5.23's own `mooncake` HiCache backend (sglang.srt.mem_cache.storage.mooncake_store,
unchanged) on top of cellar.compat.mooncake: the real HiCacheController backs host-pool pages up
and prefetches them back byte-exact after the pool is wiped.

`mooncake.store` exists only inside this test: the opt-in shim (cellar.compat.mooncake.shim) is
written to a temporary folder put on sys.path for the test and removed after it. The backend is
attached through SGLang's runtime attach API with the built-in name "mooncake", so SGLang's
factory, its MooncakeStore (setup, warmup, register_buffer of the host pool, batch_is_exist,
batch_put_from / batch_get_into and their multi-buffer forms) all run as in production.

Runs from the SGLang engine venv (`tests/engines/engine_venv.py run sglang -- -m pytest
tests/compat/test_mooncake_sglang.py`); skipped in any interpreter without SGLang.
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("sglang")

from cellar.compat.mooncake import MooncakeDistributedStore  # noqa: E402
from cellar.compat.mooncake.shim import write_shim  # noqa: E402
from tests.engines.sglang_harness import Engine, Shape  # noqa: E402

MIB = 1 << 20


@pytest.fixture
def mooncake_shim(tmp_path, monkeypatch):
    """`import mooncake.store` resolves to Cellar for this test only."""
    assert "mooncake" not in sys.modules
    monkeypatch.syspath_prepend(str(write_shim(tmp_path / "shim")))
    yield
    for name in [m for m in sys.modules if m == "mooncake" or m.startswith("mooncake.")]:
        del sys.modules[name]


def mooncake_config(address: str, segment_bytes: int) -> dict:
    """What a deployment puts in --hicache-storage-backend-extra-config for Mooncake."""
    return {"master_server_address": address, "metadata_server": "P2PHANDSHAKE",
            "protocol": "tcp", "device_name": "", "local_hostname": "127.0.0.1",
            "global_segment_size": segment_bytes, "check_server": False,
            "standalone_storage": False}


STORE_CALLS = ("batch_is_exist", "batch_put_from", "batch_get_into",
               "batch_put_from_multi_buffers", "batch_get_into_multi_buffers")


def record_calls(store: MooncakeDistributedStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the store methods the backend calls (each still runs for real)."""
    calls: list[str] = []
    for name in STORE_CALLS:
        method = getattr(store, name)

        def spy(*args, _name=name, _method=method, **kwargs):
            calls.append(_name)
            return _method(*args, **kwargs)

        monkeypatch.setattr(store, name, spy)
    return calls


def attach_mooncake(engine: Engine, address: str, segment_bytes: int) -> MooncakeDistributedStore:
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    c = engine.controller
    c.detach_storage_backend()  # the harness attaches Cellar's own backend; swap it
    c.attach_storage_backend("mooncake", model_name=engine.model,
                             storage_backend_extra_config=mooncake_config(address, segment_bytes))
    engine.backend = c.storage_backend
    assert type(engine.backend) is MooncakeStore  # SGLang's class, from SGLang's factory
    store = engine.backend.store
    assert isinstance(store, MooncakeDistributedStore)  # ... speaking to Cellar
    return store


@pytest.mark.parametrize("layout,mla", [("page_first", False), ("page_first_direct", False),
                                        ("layer_first", True)],
                         ids=["page_first-mha", "page_first_direct-mha", "layer_first-mla-multibuf"])
def test_sglang_mooncake_backend_backup_wipe_prefetch(make_cluster, connect_to, mooncake_shim,
                                                      monkeypatch, layout, mla):
    cluster = make_cluster(nodes=2, segment_size=128 * MIB)
    engine = Engine(cluster.address, model=f"mc-{layout}-{mla}", shape=Shape(layout=layout, mla=mla))
    store = None
    try:
        store = attach_mooncake(engine, cluster.address, 0)
        calls = record_calls(store, monkeypatch)
        admin = connect_to(cluster)
        before = admin.status()["object_count"]
        pages, seed = 12, 11
        assert engine.backup(pages, seed) == pages * engine.shape.page_size
        objects_per_page = 1 if mla else 2  # MHA: K and V objects per page
        assert admin.status()["object_count"] - before == pages * objects_per_page
        engine.wipe()
        got = engine.prefetch(pages, seed)
        assert got.hit_pages == pages and got.completed_pages == pages
        assert engine.exact_pages(got.host_indices, seed, pages) == pages
        # a sequence never backed up is a miss, not an error
        assert engine.prefetch(4, seed + 1).hit_pages == 0
        multi = "_multi_buffers" if layout == "layer_first" else ""  # one page over many layers
        assert {f"batch_put_from{multi}", f"batch_get_into{multi}", "batch_is_exist"} <= set(calls)
    finally:
        engine.close()
        if store is not None:
            store.close()


def test_sglang_mooncake_backend_with_embedded_segment(make_cluster, connect_to, mooncake_shim,
                                                       monkeypatch):
    """The Mooncake deployment where the engine contributes its own memory: a cluster with no
    storage node; the backend's setup (global_segment_size > 0) starts the embedded node."""
    cluster = make_cluster(nodes=0)
    monkeypatch.setenv("CELLAR_CLUSTER_SECRET", cluster.secret)
    engine = Engine(cluster.address, model="mc-embedded", shape=Shape(layout="page_first"))
    store = None
    try:
        store = attach_mooncake(engine, cluster.address, 64 * MIB)
        admin = connect_to(cluster)
        assert admin.status()["capacity_bytes"] == 64 * MIB
        pages, seed = 8, 5
        assert engine.backup(pages, seed) == pages * engine.shape.page_size
        engine.wipe()
        got = engine.prefetch(pages, seed)
        assert got.completed_pages == pages
        assert engine.exact_pages(got.host_indices, seed, pages) == pages
    finally:
        engine.close()
        if store is not None:
            store.close()
    assert admin.status()["capacity_bytes"] == 0  # the engine's memory left with it
