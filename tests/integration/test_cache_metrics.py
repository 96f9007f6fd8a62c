"""The source's §7.2 cache metrics that the SDK can see, recorded by both faces over a real
cluster (docs/lookup.md, "Cache metrics"): tokens asked and reused at the client's
`tokens_per_key`, and keys found but not used, by reason: cut by a prefix (found after an
unreadable key in a prefix get), late (not read within the budget), refused (found, but the
node that held it is gone).

Each number is a delta of `cellar.client.metrics` around one call, so tests running before in
the same process do not matter.
"""

from __future__ import annotations

import pytest

import cellar
from cellar.client import metrics
from tests.support.faces import FACES, connect_face

KIB = 1 << 10
TOKENS = 32  # tokens per key the "engine" declares


@pytest.fixture(scope="module")
def cluster(module_cluster):
    return module_cluster(nodes=1, segment_size="32MiB", allow_unknown_tenants="true")


def _sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _snapshot(op: str) -> dict[str, float]:
    out = {n: _sample(f"cellar_client_{n}_total", op=op)
           for n in ("keys", "key_hits", "tokens", "tokens_reused")}
    for reason in metrics.UNUSED_REASONS:
        out[f"unused_{reason}"] = _sample("cellar_client_unused_keys_total", op=op,
                                          reason=reason)
        out[f"unused_tokens_{reason}"] = _sample("cellar_client_unused_tokens_total", op=op,
                                                 reason=reason)
    return out


def _delta(before: dict[str, float], op: str) -> dict[str, float]:
    after = _snapshot(op)
    return {k: after[k] - v for k, v in before.items() if after[k] != v}


def _set_tokens(client, n) -> None:
    getattr(client, "client", client).tokens_per_key = n  # AsyncFace: the AsyncClient inside


@pytest.mark.parametrize("face", FACES)
def test_tokens_and_prefix_cut(cluster, face):
    client = connect_face(face, cluster.address, tenant=f"cm-{face}",
                          token=cluster.token_for(f"cm-{face}"), timeout_s=30.0)
    try:
        keys = [f"p/{i}" for i in range(8)]
        client.put_many({k: bytes([i]) * KIB for i, k in enumerate(keys) if i != 3})
        # without tokens_per_key no token series moves
        before = _snapshot("get")
        assert client.get_many(keys[:2]) == [b"\x00" * KIB, b"\x01" * KIB]
        assert _delta(before, "get") == {"keys": 2, "key_hits": 2}

        _set_tokens(client, TOKENS)
        assert client.tokens_per_key == TOKENS
        before = _snapshot("get")
        sizes = client.get_many_into(keys, [bytearray(KIB) for _ in keys], timeout_s=30.0,
                                     prefix=True)
        assert sizes == [KIB] * 3
        # keys 4..7 were found and cut by the hole at 3; 3 itself is a plain miss
        assert _delta(before, "get") == {
            "keys": 8, "key_hits": 3, "tokens": 8 * TOKENS, "tokens_reused": 3 * TOKENS,
            "unused_prefix": 4, "unused_tokens_prefix": 4 * TOKENS}

        before = _snapshot("get")
        assert client.get_many_into(keys[:2], [bytearray(KIB), bytearray(KIB)],
                                    timeout_s=0) == [cellar.LATE, cellar.LATE]
        assert _delta(before, "get") == {"keys": 2, "tokens": 2 * TOKENS}  # never asked: not found

        before = _snapshot("lookup")  # lookup's own tokens_per_key wins for its call
        result = client.lookup(keys, tokens_per_key=4)
        assert result.prefix_len == 3 and result.tokens_reused == 12
        assert _delta(before, "lookup") == {"keys": 8, "key_hits": 3, "tokens": 32,
                                            "tokens_reused": 12}

        before = _snapshot("prefix_len")
        assert client.prefix_len(keys) == 3
        assert _delta(before, "prefix_len") == {"keys": 8, "key_hits": 3, "tokens": 8 * TOKENS,
                                                "tokens_reused": 3 * TOKENS}

        for bad in (0, -1, 1.5, True, (1 << 20) + 1):
            with pytest.raises(cellar.InvalidArgument):
                _set_tokens(client, bad)
        assert client.tokens_per_key == TOKENS  # a refused setting changes nothing
        _set_tokens(client, None)
        before = _snapshot("exists")
        assert client.exists_many(keys[:2]) == [True, True]
        assert _delta(before, "exists") == {"keys": 2, "key_hits": 2}
    finally:
        client.remove_prefix("p/")
        client.close()


@pytest.mark.parametrize("face", FACES)
def test_found_but_unreadable_is_refused(make_cluster, face):
    """kill -9 the only node: the master still hands out its replicas (it has not expired the
    node), the reads fail, and those keys count as found but not used (refused)."""
    cluster = make_cluster(nodes=1, segment_size="16MiB", allow_unknown_tenants="true",
                           node_expire_after_s=60)
    client = connect_face(face, cluster.address, tenant="cm-dead",
                          token=cluster.token_for("cm-dead"), timeout_s=10.0)
    try:
        _set_tokens(client, TOKENS)
        client.put_many({f"d/{i}": b"z" * KIB for i in range(4)})
        cluster.kill_node(0)
        before = _snapshot("get")
        sizes = client.get_many_into([f"d/{i}" for i in range(4)] + ["d/none"],
                                     [bytearray(KIB) for _ in range(5)])
        assert sizes == [cellar.MISS] * 5  # an unreachable node reads as a miss
        got = _delta(before, "get")
        assert got == {"keys": 5, "tokens": 5 * TOKENS, "unused_refused": 4,
                       "unused_tokens_refused": 4 * TOKENS}, got
    finally:
        client.close()


@pytest.mark.parametrize("face", FACES)
def test_load_estimate_is_the_lookups(cluster, face):
    """`load_estimate(nbytes)` is the estimate `lookup` reports (no I/O); bad sizes refused."""
    client = connect_face(face, cluster.address, tenant=f"cm-est-{face}",
                          token=cluster.token_for(f"cm-est-{face}"), timeout_s=30.0)
    try:
        client.put_many({f"e/{i}": b"e" * (64 * KIB) for i in range(4)})
        assert len(client.get_many([f"e/{i}" for i in range(4)])) == 4
        result = client.lookup([f"e/{i}" for i in range(4)])
        estimate = client.load_estimate(result.prefix_bytes)
        assert estimate.basis == "measured" and estimate.bytes_per_s == result.bytes_per_s
        assert estimate.load_s > 0
        for bad in (-1, True, 1.5, 1 << 51):
            with pytest.raises(cellar.InvalidArgument):
                client.load_estimate(bad)
    finally:
        client.remove_prefix("e/")
        client.close()
