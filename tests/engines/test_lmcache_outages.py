"""Outages under LMCache 0.5.6's LMCacheEngine through plugin://cellar: the master or a node
is killed (kill -9) while a retrieve waits on it. The engine sees misses or a shorter prefix,
never an exception and never wrong bytes, and gets everything back once the cluster is whole.

The connector talks TCP here (`transport: tcp`) so that a dead node really stands between the
engine and its bytes (on one host the shm transport reads the segment file without the node).
Runs from the LMCache engine venv; skipped where LMCache is not installed."""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache")

import lmcache_kit as kit  # noqa: E402
import torch  # noqa: E402

import cellar  # noqa: E402
from cellar.devtools.local_cluster import LocalCluster  # noqa: E402
from cellar.devtools.ports import free_port  # noqa: E402

CHUNK = kit.CHUNK_TOKENS
CHUNKS = 12
WAIT_S = 90.0


@pytest.fixture
def cluster(outage_cluster: LocalCluster) -> LocalCluster:
    return outage_cluster  # conftest: fast liveness, nothing left stopped


def _retrieve(engine: Any, tokens: torch.Tensor, kv: torch.Tensor) -> int:
    """One retrieve from Cellar alone; asserts it returned a prefix of exact bytes and left
    the rest of the KV untouched; returns the prefix in tokens."""
    kit.drop_local(engine)
    out = torch.zeros_like(kv)
    mask = engine.retrieve(tokens, kv=out)  # an exception here fails the test: none may escape
    got = int(mask.sum())
    assert bool(mask[:got].all()) and not bool(mask[got:].any()), "not a prefix"
    assert torch.equal(out[:, :, :got], kv[:, :, :got]), "wrong bytes in the prefix"
    assert not bool(out[:, :, got:].any()), "bytes written past the prefix"
    return got


def _stored_engine(tmp_path: Path, cluster: LocalCluster, model: str) -> tuple[Any, Any, Any]:
    # timeout_s bounds how long a call waits on a dead master; generous enough that the puts
    # before the outage succeed on a loaded machine.
    config = kit.write_config(tmp_path / "outage.yaml", cluster.address, timeout_s=8.0,
                              blocking_s=30, transport="tcp")
    engine = kit.make_engine(config, model=model)
    tokens = kit.tokens_for(CHUNKS * CHUNK, seed=61)
    kv = kit.random_kv(len(tokens), seed=62)
    engine.store(tokens, kv=kv)
    stored = kit.wait_stored(engine, tokens, timeout_s=WAIT_S)
    assert stored == CHUNKS, f"only {stored} of {CHUNKS} chunks reached Cellar before the outage"
    return engine, tokens, kv


def _retrieve_while(engine: Any, tokens: torch.Tensor, kv: torch.Tensor,
                    stall: Any, kill: Any) -> int:
    """Stall the cluster (`stall`), start a retrieve, wait until it is waiting on Cellar,
    `kill`, and return the prefix the retrieve ended with."""
    conn = kit.cellar_connector(engine)
    stall()
    got: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            got.append(_retrieve(engine, tokens, kv))
        except BaseException as e:  # reported below: nothing may escape the engine
            errors.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    kit.wait_until(lambda: conn.session.in_flight > 0, "the retrieve to wait on Cellar")
    kill()
    worker.join(WAIT_S)
    assert not worker.is_alive()
    assert not errors, errors
    return got[0]


def _recovers(engine: Any, tokens: torch.Tensor, kv: torch.Tensor) -> None:
    kit.wait_until(lambda: _retrieve(engine, tokens, kv) == len(tokens),
                "the full prefix back after the restart", WAIT_S)
    assert engine.lookup(tokens) == len(tokens)


def _busiest_node(cluster: LocalCluster) -> int:
    """The index of the node holding the most objects (so killing it loses some chunks)."""
    with cellar.connect(cluster.address) as client:
        counts = {n["node_id"]: int(n["object_count"]) for n in client.status()["nodes"]}
    names = [child.name for child in cluster.nodes]
    return names.index(max(counts, key=lambda node_id: counts[node_id]))


def test_node_killed_mid_retrieve(tmp_path: Path, cluster: LocalCluster) -> None:
    engine, tokens, kv = _stored_engine(tmp_path, cluster, "test/outage-node")
    try:
        victim = _busiest_node(cluster)
        got = _retrieve_while(engine, tokens, kv,
                              stall=lambda: cluster.signal_node(victim, signal.SIGSTOP),
                              kill=lambda: cluster.kill_node(victim))
        assert got < len(tokens)  # the victim held some chunks: they are missing now
        # While the node is down: lookups and retrieves answer (shorter), stores are dropped
        # or land on the other node, and nothing raises.
        assert engine.lookup(tokens) <= len(tokens)
        assert _retrieve(engine, tokens, kv) < len(tokens)
        cluster.restart_node(victim)  # same identity and segment file: it re-attaches its chunks
        _recovers(engine, tokens, kv)
    finally:
        kit.destroy(engine)


def test_master_killed_mid_retrieve(tmp_path: Path, cluster: LocalCluster) -> None:
    engine, tokens, kv = _stored_engine(tmp_path, cluster, "test/outage-master")
    try:
        got = _retrieve_while(engine, tokens, kv,
                              stall=lambda: cluster.signal_master(signal.SIGSTOP),
                              kill=lambda: cluster.kill_master())
        assert got == 0  # no master: no replica can be found
        assert engine.lookup(tokens) == 0
        more = kit.tokens_for(2 * CHUNK, seed=63)
        engine.store(more, kv=kit.random_kv(len(more), seed=64))  # dropped, not raised
        cluster.start_master()  # rebuilds its table from the nodes' own indexes
        _recovers(engine, tokens, kv)
    finally:
        kit.destroy(engine)


def test_engine_starts_while_cellar_is_down(tmp_path: Path) -> None:
    """No master at the configured address: the engine starts, lookups are 0 and stores are
    dropped without an exception; once a cluster serves that address the same engine stores
    and retrieves through it (the connector opens its client again after its backoff)."""
    port = free_port()
    config = kit.write_config(tmp_path / "down.yaml", f"127.0.0.1:{port}", timeout_s=2.0)
    engine = kit.make_engine(config, model="test/down-at-start")
    try:
        tokens = kit.tokens_for(3 * CHUNK, seed=81)
        kv = kit.random_kv(len(tokens), seed=82)
        assert engine.lookup(tokens) == 0
        engine.store(tokens, kv=kv)  # local only: the remote put is dropped
        kit.drop_local(engine)
        assert _retrieve(engine, tokens, kv) == 0
        conn = kit.cellar_connector(engine)

        def listed() -> list[str]:
            return asyncio.run_coroutine_threadsafe(conn.list(), conn.loop).result(WAIT_S)

        assert listed() == []  # Cellar unreachable: no keys, no exception
        with LocalCluster(2, "64MiB", port=port):
            def stored() -> bool:
                engine.store(tokens, kv=kv)
                return kit.wait_stored(engine, tokens, timeout_s=5.0) == 3

            kit.wait_until(stored, "a store to reach the cluster once it is up", WAIT_S)
            assert _retrieve(engine, tokens, kv) == len(tokens)
            chunks = [k for _s, _e, k in engine.token_database.process_tokens(tokens)]
            assert listed() == sorted(k.to_string() for k in chunks)
    finally:
        kit.destroy(engine)
