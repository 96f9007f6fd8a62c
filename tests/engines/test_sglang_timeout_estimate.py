"""SGLang's `timeout` prefetch budget from Cellar's estimate, through SGLang's own code: the
backend inside a real HiCacheController answers `prefetch_timeout_config()` after real
backups and prefetches; SGLang's own parser takes those keys beside the backend's settings (the
backend still gets its own), SGLang's own `StorageAttachment.apply_runtime_config` turns them
into the per-page budget it waits, and that budget covers twice the backend's estimated load
for any page count; the SDK's token metrics count the pages at the page's tokens."""

from __future__ import annotations

import json
from types import SimpleNamespace

from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
from sglang.srt.mem_cache.unified_cache.storage_attachment import StorageAttachment
from sglang_harness import BACKEND_CONFIG, Engine, Shape

from cellar.client import metrics
from cellar.integrations.sglang.backend import settings_from
from cellar.integrations.sglang.timeout import DEFAULT_MARGIN, budget_s

PAGES, SEED = 8, 57


def _sample(name: str, op: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, {"op": op}) or 0.0


def test_the_estimate_sizes_sglangs_timeout_budget(cluster) -> None:
    engine = Engine(cluster.address, model="timeout-estimate", shape=Shape())
    try:
        backend = engine.backend
        page_tokens = engine.shape.page_size
        assert engine.backup(PAGES, SEED) == PAGES * page_tokens
        engine.wipe()
        tokens_before = _sample("cellar_client_tokens_reused_total", "get")
        got = engine.prefetch(PAGES, SEED)
        assert got.completed_pages == PAGES
        # MHA: K and V objects of a page each stand for half its tokens
        assert _sample("cellar_client_tokens_reused_total", "get") - tokens_before == \
            PAGES * page_tokens

        config = backend.prefetch_timeout_config()
        assert config is not None and set(config) == {"prefetch_timeout_base",
                                                      "prefetch_timeout_per_ki_token"}
        extra = {**BACKEND_CONFIG, "master": cluster.address, **config}
        parsed = HybridCacheController.parse_storage_backend_extra_config(json.dumps(extra))
        backend_extra, base, per_ki_token = parsed[0], parsed[2], parsed[3]
        assert (base, per_ki_token) == (config["prefetch_timeout_base"],
                                        config["prefetch_timeout_per_ki_token"])
        assert settings_from(backend_extra)["master"] == cluster.address

        cache = SimpleNamespace(enable_storage=False, page_size=page_tokens)
        StorageAttachment(cache).apply_runtime_config(  # type: ignore[arg-type]
            storage_backend=None, prefetch_threshold=256, prefetch_timeout_base=base,
            prefetch_timeout_per_ki_token=per_ki_token, hicache_storage_pass_prefix_keys=False,
            enable_storage=False, enable_storage_metrics=False, extra_metric_labels=None)
        page_bytes = backend.pages.geometry.page_bytes
        client = backend.link._get()
        for pages in (1, PAGES, 1024):
            sglang_wait_s = cache.prefetch_timeout_base + pages * cache.prefetch_timeout_per_page
            assert abs(sglang_wait_s - budget_s(config, pages, page_tokens)) < 1e-9
            estimate = client.load_estimate(pages * page_bytes)
            assert sglang_wait_s >= DEFAULT_MARGIN * estimate.load_s * (1 - 1e-9), pages
        # a larger margin gives a longer budget per token
        slower = backend.prefetch_timeout_config(margin=2 * DEFAULT_MARGIN)
        assert slower is not None
        assert slower["prefetch_timeout_per_ki_token"] > config["prefetch_timeout_per_ki_token"]
    finally:
        engine.close()
