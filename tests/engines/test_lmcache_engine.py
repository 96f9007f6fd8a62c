"""LMCache 0.5.6's own LMCacheEngine stores, looks up and retrieves KV through plugin://cellar
on a real Cellar cluster (master + 2 nodes on 127.0.0.1), both chunk-metadata modes, partial
last chunks, two engine processes sharing a prefix, the format guard, and LMCache's event loop
kept free while a Cellar call waits.

Runs from the LMCache engine venv (tests/engines/engine_venv.py run lmcache -- -m pytest ...);
skipped where LMCache is not installed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("lmcache")

import lmcache_kit as kit  # noqa: E402
import torch  # noqa: E402

import cellar  # noqa: E402
from cellar.devtools.local_cluster import LocalCluster  # noqa: E402
from cellar.integrations.kvformat import HEADER_BYTES  # noqa: E402
from cellar.integrations.lmcache import CellarConnector  # noqa: E402

HERE = Path(__file__).resolve().parent
CHUNK = kit.CHUNK_TOKENS
WAIT_S = 60.0  # generous bound of every poll on a loaded 2-core machine


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(2, "64MiB") as c:
        yield c


def _engine(tmp_path: Path, cluster: LocalCluster, *, meta: bool = False,
            timeout_s: float = 5.0, **kw: object):
    config = kit.write_config(tmp_path / f"lmcache-{meta}.yaml", cluster.address,
                              save_chunk_meta=meta, timeout_s=timeout_s,
                              blocking_s=int(2 * timeout_s))
    return kit.make_engine(config, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("meta", [False, True], ids=["raw", "chunk-meta"])
def test_store_lookup_retrieve_bytes_exact(tmp_path: Path, cluster: LocalCluster,
                                           meta: bool) -> None:
    model = f"test/roundtrip-{meta}"
    engine = _engine(tmp_path, cluster, meta=meta, model=model)
    try:
        conn = kit.cellar_connector(engine)
        assert isinstance(conn, CellarConnector)  # loaded by LMCache from the config alone
        tokens = kit.tokens_for(5 * CHUNK + 7, seed=11)  # 5 full chunks and a partial one
        kv = kit.random_kv(len(tokens), seed=12)
        engine.store(tokens, kv=kv)
        assert kit.wait_stored(engine, tokens) == 6
        kit.drop_local(engine)  # from here on only Cellar holds the chunks

        assert engine.lookup(tokens) == len(tokens)
        out = torch.zeros_like(kv)
        mask = engine.retrieve(tokens, kv=out)
        assert bool(mask.all())
        assert torch.equal(out, kv)  # every byte, partial last chunk included

        # What Cellar holds: one object per chunk under the format's namespace, sized by the
        # layout of the mode (raw KV, or header + LMCache metadata + KV).
        keys = [k for _s, _e, k in engine.token_database.process_tokens(tokens)]
        chunk_bytes = conn.full_chunk_size_bytes
        extra = HEADER_BYTES + conn.remote_metadata_bytes if meta else 0
        with cellar.connect(cluster.address) as client:
            sizes = [client.size(conn._name(k)) for k in keys]
            assert client.exists(conn.format.key("format"))
        assert sizes == [chunk_bytes + extra] * 5 + [7 * conn.single_token_size + extra]
        assert all(conn._name(k).startswith(conn.format.namespace() + "/") for k in keys)
        # list(): exactly the stored chunks, as LMCache key strings (no descriptor)
        assert _on_loop(conn, conn.list()) == sorted(k.to_string() for k in keys)
    finally:
        kit.destroy(engine)


def test_block_stored_hashes_are_lmcaches_chunk_hashes(tmp_path: Path) -> None:
    """The KV events of the chunks LMCache stores carry LMCache's own chunk hashes
    (`CacheEngineKey.chunk_hash`), in chunk order; the format descriptor keeps its key hash."""
    from events_kit import event_flags, wait_hashes

    from cellar.master.serving.kv_events import key_hash

    flags, replay = event_flags()
    with LocalCluster(2, "64MiB", master_flags=flags) as events_cluster:
        engine = _engine(tmp_path, events_cluster, model="test/events")
        try:
            conn = kit.cellar_connector(engine)
            tokens = kit.tokens_for(4 * CHUNK + 3, seed=31)
            engine.store(tokens, kv=kit.random_kv(len(tokens), seed=32))
            assert kit.wait_stored(engine, tokens) == 5
            keys = [k for _s, _e, k in engine.token_database.process_tokens(tokens)]
            descriptor = key_hash(conn.format.key("format"))
            want = [k.chunk_hash for k in keys]
            assert wait_hashes(replay, "BlockStored", len(want), exclude=descriptor) == want
        finally:
            kit.destroy(engine)


def _run_kit(*args: str) -> dict:
    env = dict(os.environ, PYTHONHASHSEED="0", LMCACHE_LOG_LEVEL="WARNING")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(HERE / "lmcache_kit.py"), *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _on_loop(conn: CellarConnector, coro):  # type: ignore[no-untyped-def]
    """Run a connector coroutine where LMCache runs it: on LMCache's own loop."""
    return asyncio.run_coroutine_threadsafe(coro, conn.loop).result(WAIT_S)


def test_connector_surface(tmp_path: Path, cluster: LocalCluster) -> None:
    """The RemoteConnector methods LMCache calls besides store/retrieve, loaded this time as
    `class_name: CellarConnector` (LMCache wraps it in its DynamicConnectorAdapter)."""
    config = kit.write_config(tmp_path / "surface.yaml", cluster.address,
                              class_name="CellarConnector")
    engine = kit.make_engine(config, model="test/surface")
    try:
        conn = kit.cellar_connector(engine)
        assert isinstance(conn, CellarConnector)
        tokens = kit.tokens_for(4 * CHUNK, seed=71)
        keys = [k for _s, _e, k in engine.token_database.process_tokens(tokens)]
        engine.store(tokens, kv=kit.random_kv(len(tokens), seed=72))
        assert kit.wait_stored(engine, tokens) == 4
        other = kit.tokens_for(2 * CHUNK, seed=73)
        absent = [k for _s, _e, k in engine.token_database.process_tokens(other)]
        assert _on_loop(conn, conn.ping()) == 0
        assert _on_loop(conn, conn.exists(keys[0])) and conn.exists_sync(keys[3])
        assert not _on_loop(conn, conn.exists(absent[0])) and not conn.exists_sync(absent[0])
        assert _on_loop(conn, conn.batched_async_contains("l1", keys + absent)) == 4
        assert conn.batched_contains(keys[:3] + absent + keys[3:]) == 3
        assert _on_loop(conn, conn.batched_async_contains("l2", [])) == 0
        assert conn.remove_sync(keys[2]) and not conn.remove_sync(keys[2])
        assert _on_loop(conn, conn.batched_async_contains("l3", keys)) == 2
        objs = _on_loop(conn, conn.batched_get(keys))  # a prefix, then None for the rest
        assert [o is not None for o in objs] == [True, True, False, False]
        for obj in objs[:2]:
            obj.ref_count_down()
        # list(): the chunks still stored (keys[2] was removed), as LMCache key strings
        assert _on_loop(conn, conn.list()) == sorted(k.to_string() for k in keys if k != keys[2])
    finally:
        kit.destroy(engine)


def test_two_engine_processes_share_a_prefix(tmp_path: Path, cluster: LocalCluster) -> None:
    """Instance A (one process) stores prefix + its suffix; instance B (another process) asks
    for prefix + another suffix and gets exactly A's prefix KV, nothing more."""
    config = kit.write_config(tmp_path / "shared.yaml", cluster.address)
    prefix = 4 * CHUNK
    stored = _run_kit("store", str(config), str(prefix), str(2 * CHUNK + 3), "21")
    assert stored == {"stored_chunks": 7}
    out_file = tmp_path / "b.pt"
    got = _run_kit("retrieve", str(config), str(prefix), str(3 * CHUNK), "22", str(out_file))
    assert got == {"lookup_tokens": prefix, "retrieved_tokens": prefix}
    result = torch.load(out_file)
    a_kv = kit.random_kv(prefix + 2 * CHUNK + 3, seed=21)
    assert torch.equal(result["kv"][:, :, :prefix], a_kv[:, :, :prefix])
    assert not bool(result["mask"][prefix:].any())
    assert not bool(result["kv"][:, :, prefix:].any())  # B's own suffix untouched


def test_other_format_sees_a_miss(tmp_path: Path, cluster: LocalCluster) -> None:
    """Same tokens, another KV dtype or chunk-metadata mode: other keys, a miss, no bytes."""
    writer = _engine(tmp_path, cluster, model="test/guard")
    tokens = kit.tokens_for(3 * CHUNK, seed=31)
    try:
        writer.store(tokens, kv=kit.random_kv(len(tokens), seed=32))
        assert kit.wait_stored(writer, tokens) == 3
    finally:
        kit.destroy(writer)
    for kwargs in ({"dtype": torch.float16}, {"meta": True}, {"model": "test/guard-v2"}):
        reader = _engine(tmp_path, cluster, **{"model": "test/guard", **kwargs})
        try:
            assert reader.lookup(tokens) == 0, kwargs
            out = torch.zeros(2, kit.LAYERS, len(tokens), kit.KV_HEADS * kit.HEAD_DIM,
                              dtype=kwargs.get("dtype", kit.DTYPE))
            assert not bool(reader.retrieve(tokens, kv=out).any()), kwargs
            assert not bool(out.any())
        finally:
            kit.destroy(reader)


@pytest.mark.parametrize("meta", [False, True], ids=["raw", "chunk-meta"])
def test_object_of_wrong_size_is_refused(tmp_path: Path, cluster: LocalCluster,
                                         meta: bool) -> None:
    """Objects planted under the reader's own keys whose size or header does not fit its
    format are refused: the prefix stops before them and their bytes never reach the KV."""
    engine = _engine(tmp_path, cluster, meta=meta, model=f"test/sizes-{meta}")
    try:
        conn = kit.cellar_connector(engine)
        tokens = kit.tokens_for(4 * CHUNK, seed=41)
        keys = [k for _s, _e, k in engine.token_database.process_tokens(tokens)]
        kv = kit.random_kv(len(tokens), seed=42)
        engine.store(tokens[:CHUNK], kv=kv[:, :, :CHUNK])
        assert kit.wait_stored(engine, tokens[:CHUNK]) == 1
        token = conn.single_token_size
        extra = HEADER_BYTES + conn.remote_metadata_bytes if meta else 0
        bad = {  # chunk 1: longer than a chunk; chunk 2: not whole tokens (or no header)
            1: bytes([0xAB]) * (conn.full_chunk_size_bytes + extra + token),
            2: bytes([0xCD]) * (extra + 3 * token + 1),
        }
        with cellar.connect(cluster.address) as client:
            for i, value in bad.items():
                client.put(conn._name(keys[i]), value)
        kit.drop_local(engine)
        out = torch.zeros_like(kv)
        mask = engine.retrieve(tokens, kv=out)
        assert int(mask.sum()) == CHUNK and bool(mask[:CHUNK].all())
        assert torch.equal(out[:, :, :CHUNK], kv[:, :, :CHUNK])
        assert not bool(out[:, :, CHUNK:].any())
        for i in bad:  # each refused alone too, not only cut off by the prefix rule
            assert asyncio.run_coroutine_threadsafe(conn.get(keys[i]), conn.loop).result(
                WAIT_S) is None
        # LMCache's async-loading path (batched_get_non_blocking) stops at the same place.
        prefix = asyncio.run_coroutine_threadsafe(
            conn.batched_get_non_blocking("lookup-1", keys), conn.loop).result(WAIT_S)
        try:
            assert len(prefix) == 1 and torch.equal(prefix[0].tensor, kv[:, :, :CHUNK])
        finally:
            for obj in prefix:
                obj.ref_count_down()
    finally:
        kit.destroy(engine)


@pytest.mark.parametrize("stalled", ["master", "nodes"])
def test_loop_keeps_running_while_a_cellar_call_waits(tmp_path: Path, cluster: LocalCluster,
                                                      stalled: str) -> None:
    """With the master (a wait on the metadata line) or every node (over tcp: a wait on the
    data plane) stopped by SIGSTOP, a retrieve waits on Cellar; meanwhile a ticker task on
    LMCache's event loop (the loop every connector coroutine runs on) keeps ticking. After
    SIGCONT the same retrieve completes with exact bytes."""
    # Generous Cellar and LMCache timeouts: the call must still be waiting after 50 ticks.
    config = kit.write_config(tmp_path / "loop.yaml", cluster.address, timeout_s=60.0,
                              blocking_s=120, transport="tcp")
    engine = kit.make_engine(config, model=f"test/loop-{stalled}")
    conn = kit.cellar_connector(engine)
    ticks: list[float] = []
    stop = threading.Event()

    async def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.002)

    def signal_stalled(sig: int) -> None:
        if stalled == "master":
            cluster.signal_master(sig)
        else:
            for i in range(len(cluster.nodes)):
                cluster.signal_node(i, sig)

    tick_future = asyncio.run_coroutine_threadsafe(ticker(), conn.loop)
    stopped = False
    try:
        tokens = kit.tokens_for(8 * CHUNK, seed=51)
        kv = kit.random_kv(len(tokens), seed=52)
        engine.store(tokens, kv=kv)
        assert kit.wait_stored(engine, tokens) == 8
        kit.drop_local(engine)
        signal_stalled(signal.SIGSTOP)
        stopped = True
        out = torch.zeros_like(kv)
        result: list[torch.Tensor] = []
        worker = threading.Thread(target=lambda: result.append(engine.retrieve(tokens, kv=out)))
        worker.start()
        kit.wait_until(lambda: conn.session.in_flight > 0, "the retrieve to reach Cellar")
        during = len(ticks)
        kit.wait_until(lambda: len(ticks) >= during + 50, "50 ticks of the loop")
        assert conn.session.in_flight > 0 and worker.is_alive()  # the call is still waiting
        signal_stalled(signal.SIGCONT)
        stopped = False
        worker.join(WAIT_S)
        assert not worker.is_alive()
        assert bool(result[0].all()) and torch.equal(out, kv)
    finally:
        if stopped:
            signal_stalled(signal.SIGCONT)
        stop.set()
        tick_future.result(WAIT_S)
        kit.destroy(engine)


def test_bad_plugin_settings_are_refused(tmp_path: Path) -> None:
    """A timeout that is not a number of seconds in range is refused when LMCache builds the
    connector (cellar.InvalidArgument, which LMCache logs): the engine runs without the remote
    tier instead of with a nonsense bound."""
    for timeout_s, refused in (("5", False), ("soon", True), ("0", True), ("-3", True),
                               ("601", True)):
        config = kit.write_config(tmp_path / "bad.yaml", "127.0.0.1:1",
                                  timeout_s=timeout_s)  # type: ignore[arg-type]
        engine = kit.make_engine(config, model="test/bad-settings")
        try:
            # (A good setting builds the connector even with no master there: it opens lazily.)
            connection = kit.remote_backend(engine).connection
            assert (connection is None) == refused, timeout_s
            tokens = kit.tokens_for(CHUNK, seed=91)
            assert engine.lookup(tokens) == 0
        finally:
            kit.destroy(engine)
