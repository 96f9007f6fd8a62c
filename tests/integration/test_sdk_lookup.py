"""`lookup` over a real cluster: the leading run per tier and its bytes, the load estimate
against the measured load, and the advice flipping with the caller's prefill rate."""

from __future__ import annotations

import statistics
import time

import pytest

import cellar
from cellar.advice import LOAD, RECOMPUTE
from tests.support.faces import FACES, connect_face
from tests.support.http import post_json

KIB = 1 << 10
PAGE_BYTES = 64 * KIB
TOKENS_PER_KEY = 16


def _value(i: int) -> bytes:
    return bytes([i % 251]) * (PAGE_BYTES + i)  # sizes differ, so the bytes prove which keys


@pytest.mark.parametrize("face", FACES)
def test_lookup_run_bytes_tier_estimate_and_advice(module_cluster, face):
    cluster = module_cluster(nodes=2, segment_size="64MiB")
    client = connect_face(face, cluster.address, timeout_s=30.0)
    try:
        keys = [f"lookup-{face}/{i:03d}" for i in range(100)]
        assert client.put_many({k: _value(i) for i, k in enumerate(keys[:60])}) \
            == [cellar.Status.OK] * 60
        stored = sum(len(_value(i)) for i in range(60))

        first = client.lookup(keys)
        assert (first.keys, first.prefix_len, first.prefix_bytes) == (100, 60, stored)
        assert set(first.tiers) == {"dram"}
        assert (first.tiers["dram"].keys, first.tiers["dram"].nbytes) == (60, stored)
        assert first.advice is None and first.tokens_reused is None

        # the estimate against the measured load of the same keys (loads first teach the
        # client its throughput; the estimate then comes from those measurements)
        loads = []
        for _ in range(5):
            started = time.perf_counter()
            values = client.get_many(keys[:60])
            loads.append(time.perf_counter() - started)
            assert values[7] == _value(7)
        measured = statistics.median(loads)
        est = client.lookup(keys)
        assert est.basis == "measured" and est.transport in ("tcp", "shm", "rdma")
        assert measured / 2 <= est.load_s <= measured * 2, (est, loads)

        # the advice flips where recompute becomes faster than loading
        tokens = 60 * TOKENS_PER_KEY
        slow_prefill = tokens / (est.load_s * 20)   # recompute takes 20x the load: load
        fast_prefill = tokens / (est.load_s / 20)   # recompute takes 1/20 of it: recompute
        slow = client.lookup(keys, prefill_tokens_per_s=slow_prefill, tokens_per_key=TOKENS_PER_KEY)
        fast = client.lookup(keys, prefill_tokens_per_s=fast_prefill, tokens_per_key=TOKENS_PER_KEY)
        assert slow.advice == LOAD and fast.advice == RECOMPUTE
        assert slow.tokens_reused == fast.tokens_reused == tokens
        assert slow.prefill_saved_s > slow.load_s and fast.prefill_saved_s < fast.load_s

        # a hole at key 10 ends the run there
        assert client.remove(keys[10])
        holed = client.lookup(keys)
        assert holed.prefix_len == 10
        assert holed.prefix_bytes == sum(len(_value(i)) for i in range(10))
        assert holed.tiers["dram"].keys == 10
        nothing = client.lookup(keys[10:], prefill_tokens_per_s=1.0, tokens_per_key=16)
        assert (nothing.prefix_len, nothing.prefix_bytes, nothing.tiers) == (0, 0, {})
        assert nothing.advice == RECOMPUTE and nothing.load_s == 0.0
    finally:
        client.close()


def test_lookup_refuses_bad_input_and_changes_nothing(module_cluster):
    cluster = module_cluster(nodes=2, segment_size="64MiB")
    client = connect_face("sync", cluster.address, timeout_s=30.0)
    try:
        client.put("bad-input/0", b"x" * 100)
        for kwargs in ({"prefill_tokens_per_s": 1000.0},  # no tokens_per_key
                       {"prefill_tokens_per_s": -1.0, "tokens_per_key": 16},
                       {"prefill_tokens_per_s": float("nan"), "tokens_per_key": 16},
                       {"prefill_tokens_per_s": 10.0, "tokens_per_key": 0}):
            with pytest.raises(cellar.InvalidArgument):
                client.lookup(["bad-input/0"], **kwargs)
        with pytest.raises(cellar.InvalidArgument):
            client.lookup(["bad-input/0", ""])  # an empty key
        assert client.lookup(["bad-input/0"]).prefix_len == 1
    finally:
        client.close()


def _post(cluster, body: dict, token: str | None) -> tuple[int, dict]:
    return post_json(cluster, "/api/v1/lookup", body, token)


def test_http_lookup_with_a_tenant_token(module_cluster):
    cluster = module_cluster(nodes=2, segment_size="64MiB")
    token = cluster.token_for("carol")
    client = cellar.connect(cluster.address, tenant="carol", token=token, timeout_s=30.0)
    try:
        keys = [f"http/{i}" for i in range(10)]
        for key in keys[:4]:
            client.put(key, b"h" * 1000)
        status, body = _post(cluster, {"keys": keys}, token)
        assert status == 200 and body["prefix_len"] == 4 and body["prefix_bytes"] == 4000
        assert body["tiers"] == {"dram": {"keys": 4, "bytes": 4000}} and body["advice"] is None
        status, body = _post(cluster, {"keys": keys, "bytes_per_s": 1e6, "rtt_s": 0.001,
                                       "prefill_tokens_per_s": 1000.0, "tokens_per_key": 16}, token)
        assert status == 200 and body["load_s"] == pytest.approx(0.005)
        assert body["tokens_reused"] == 64 and body["advice"] == "load"  # 64 ms saved > 5 ms
        assert _post(cluster, {"keys": keys}, None)[0] == 401
        assert _post(cluster, {"keys": keys, "tenant": "default"}, token)[0] == 403
        assert _post(cluster, {"keys": keys, "bytes_per_s": -1}, token)[0] == 400
        assert _post(cluster, {"keys": "http/0"}, token)[0] == 400
    finally:
        client.close()
