"""Mooncake's indexer prefix query on the master's HTTP port (/query_by_hash, /query by token
ids for SGLang's page hashing) over a real cluster: the longest held run of engine hashes per
medium, in tokens; it follows removes; a tenant sees only its own objects; malformed or
unreproducible queries are refused with 400, missing or foreign tokens with 401/403."""

from __future__ import annotations

from typing import Any

import cellar
from cellar.client import PutHints
from cellar.master.serving.prefix_query import sglang_page_hashes
from tests.support.http import post_json

PAGE = 16


def _post(cluster: Any, path: str, body: dict[str, Any], token: str | None) -> tuple[int, Any]:
    return post_json(cluster, path, body, token)


def _matched(reply: Any, tenant: str, instance: str = "cellar") -> dict[str, Any]:
    assert list(reply) == [tenant]
    return reply[tenant][instance]


def test_query_by_hash_and_by_tokens(module_cluster):
    cluster = module_cluster(nodes=2, segment_size="64MiB")
    token, other = cluster.token_for("dave"), cluster.token_for("erin")
    client = cellar.connect(cluster.address, tenant="dave", token=token, timeout_s=30.0)
    try:
        tokens = [(7919 * i + 13) % 50_000 for i in range(6 * PAGE + 5)]  # 6 pages and a tail
        hashes = sglang_page_hashes(tokens, PAGE)
        assert len(hashes) == 6
        keys = [f"ns/page-{i}" for i in range(6)]
        held = [0, 1, 2, 3, 5]  # page 4 missing: the run stops there
        client.put_many([(keys[i], b"kv" * 100) for i in held],
                        hints=PutHints(engine_hashes={keys[i]: hashes[i] for i in held}))
        client.put("ns/plain", b"no engine hash")

        body = {"model": "m", "seq_hashes": hashes, "block_size": PAGE, "tenant_id": "dave"}
        status, reply = _post(cluster, "/query_by_hash", body, token)
        assert status == 200
        assert _matched(reply, "dave") == {"longest_matched": 4 * PAGE, "CPU": 4 * PAGE,
                                           "DISK": 0, "DP": {"0": 4 * PAGE}}
        legacy = {"model": "m", "block_hash": hashes, "block_size": PAGE, "instance_id": "w1"}
        assert _matched(_post(cluster, "/query_by_hash", legacy, token)[1], "dave",
                        "w1")["longest_matched"] == 4 * PAGE
        status, reply = _post(cluster, "/query", {"model": "m", "token_ids": tokens,
                                                  "block_size": PAGE}, token)
        assert status == 200 and _matched(reply, "dave")["longest_matched"] == 4 * PAGE

        assert client.remove(keys[1])  # follows the object table
        assert _matched(_post(cluster, "/query_by_hash", body, token)[1],
                        "dave")["longest_matched"] == PAGE

        # another tenant holds none of it, and cannot ask about dave's
        assert _matched(_post(cluster, "/query_by_hash", {**body, "tenant_id": "erin"},
                              other)[1], "erin")["longest_matched"] == 0
        assert _post(cluster, "/query_by_hash", body, other)[0] == 403
        assert _post(cluster, "/query_by_hash", body, None)[0] == 401

        for bad_path, bad in (
                ("/query_by_hash", {**body, "block_size": 0}),
                ("/query_by_hash", {**body, "seq_hashes": [1 << 64]}),
                ("/query_by_hash", {**body, "seq_hashes": "abc"}),
                ("/query_by_hash", {**body, "model": "m" * 300}),
                ("/query", {"token_ids": [1 << 32] * PAGE, "block_size": PAGE}),
                ("/query", {"token_ids": tokens, "block_size": PAGE, "cache_salt": "s"}),
                ("/query", {"token_ids": tokens, "block_size": PAGE, "hash_scheme": "lmcache"})):
            status, reply = _post(cluster, bad_path, bad, token)
            assert status == 400, (bad_path, bad, reply)
        assert client.exists(keys[0])  # a refused query changed nothing
    finally:
        client.close()
