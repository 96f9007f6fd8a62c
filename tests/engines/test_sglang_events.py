"""Through SGLang's real HiCacheController, the KV events Cellar publishes for the pages it
backs up name each page by SGLang's own event hash (`hash_str_to_int64` of its page hash, what
SGLang's radix-cache events and the routers that read them use), once per object of the page,
in the order of the pages; the format descriptor (not a page) keeps its key hash. Cellar's own
reproduction of SGLang's page hashing (/query by token ids) gives the same hashes."""

from __future__ import annotations

import json
import urllib.request

import pytest
from events_kit import event_flags, wait_hashes
from sglang_harness import Engine, Shape

from cellar.master.serving.kv_events import key_hash
from cellar.master.serving.prefix_query import sglang_page_hashes


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_block_stored_hashes_are_sglangs_page_hashes(fresh_cluster, mla: bool) -> None:
    from sglang.srt.mem_cache.utils import hash_str_to_int64

    flags, replay = event_flags()
    cluster = fresh_cluster(**flags)
    engine = Engine(cluster.address, model=f"events-{mla}", shape=Shape(mla=mla))
    try:
        pages, seed = 9, 23
        assert engine.backup(pages, seed) == pages * engine.shape.page_size
        per = engine.backend.pages.geometry.objects_per_page
        want = [hash_str_to_int64(h)
                for h in engine.page_hashes(engine.tokens(pages, seed)) for _ in range(per)]
        descriptor = key_hash(engine.backend.format.descriptor_key())
        assert wait_hashes(replay, "BlockStored", len(want), exclude=descriptor) == want

        # Cellar reproduces SGLang's page hashing: /query by token ids finds the pages
        tokens = engine.tokens(pages, seed)
        assert sglang_page_hashes(tokens, engine.shape.page_size) == want[::per]
        body = {"model": "m", "token_ids": tokens + [5, 6], "block_size": engine.shape.page_size}
        request = urllib.request.Request(
            f"http://127.0.0.1:{cluster.http_port}/query", data=json.dumps(body).encode(),
            method="POST", headers={"Authorization": f"Bearer {cluster.token_for('default')}"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert json.loads(reply.read())["default"]["cellar"]["CPU"] == len(tokens)

        engine.backend.clear()  # remove_prefix: one BlockRemoved per object, same hashes
        removed = wait_hashes(replay, "BlockRemoved", len(want), exclude=descriptor)
        assert sorted(removed) == sorted(want)
    finally:
        engine.close()
