"""Cellar as the L2 of LMCache 0.5.6's multiprocess (MP) mode, through LMCache's own classes:
its `StorageManager` (L1 manager, store and prefetch controllers) built from the command-line
lines of docs/engines-lmcache.md, with `CellarL2Adapter` loaded by LMCache's `plugin` adapter
type from configuration alone; and the adapter's interface driven directly, as LMCache's own
L2 adapter tests drive theirs (submit, wait on the event fd, collect).

Runs from the LMCache engine venv against a real loopback cluster; skipped where LMCache is
not installed."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache")

import lmcache_mp_kit as kit  # noqa: E402
import torch  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.plugin_l2_adapter import (  # noqa: E402
    PluginL2AdapterConfig,
)

import cellar  # noqa: E402
from cellar.integrations.lmcache.l2_adapter import (  # noqa: E402
    CellarL2Adapter,
    CellarL2AdapterConfig,
    object_format,
    object_name,
)

CHUNKS = 1000
HERE = Path(__file__).resolve().parent


def test_store_lookup_load_unlock_1000_chunks_byte_exact(cluster) -> None:
    node = kit.Node(cluster.address)
    try:
        keys = kit.keys_for(CHUNKS, seed=1)
        node.store(keys)
        node.wait_l2_stored(CHUNKS, kit.chunk_bytes())
        node.drop_l1(keys)
        got = node.prefetch(keys)
        assert (got.hits, got.l2_hits) == (CHUNKS, CHUNKS)  # all of it from Cellar
        assert node.read(keys, got) == CHUNKS
        # Read locks released (L1 drops the loaded copies, or may): the next prefetch works.
        node.drop_l1(keys)
        again = node.prefetch(keys[:10])
        assert again.l2_hits == 10 and node.read(keys[:10], again) == 10
        status = node.adapter.report_status()
        assert status["is_healthy"] and status["failed_tasks"] == 0
    finally:
        node.close()


def test_two_processes_share_chunks(cluster) -> None:
    count, seed = 64, 2
    node = kit.Node(cluster.address)
    try:
        node.store(kit.keys_for(count, seed))
        node.wait_l2_stored(count, kit.chunk_bytes())
    finally:
        node.close()
    done = subprocess.run([sys.executable, str(HERE / "lmcache_mp_worker.py"), cluster.address,
                           str(count), str(seed)], capture_output=True, text=True,
                          timeout=kit.WAIT_S, env=dict(os.environ), cwd=HERE)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"hits": count, "l2_hits": count, "exact": count}


def test_another_kv_format_misses(cluster) -> None:
    count = 16
    keys = kit.keys_for(count, seed=3)
    node = kit.Node(cluster.address)
    try:
        node.store(keys)
        node.wait_l2_stored(count, kit.chunk_bytes())
        node.drop_l1(keys)
        # Same keys, same object size, another dtype; another shape: a miss, never those bytes.
        for other in (kit.layout(dtype=torch.float16), kit.layout(shape=(2, 4, 16, 32))):
            assert kit.chunk_bytes(other) == kit.chunk_bytes()
            got = node.prefetch(keys, other)
            assert got.hits == 0
        # Another model (a key field) misses as well; the writer's format still hits.
        assert node.prefetch(kit.keys_for(count, seed=3, model="other/model")).hits == 0
        got = node.prefetch(keys)
        assert got.l2_hits == count and node.read(keys, got) == count
    finally:
        node.close()


# ---- the adapter's interface, driven directly ------------------------------------------------

def _wait_fd(fd: int, timeout_s: float = kit.WAIT_S) -> None:
    ready, _, _ = select.select([fd], [], [], timeout_s)
    assert ready, "event fd not signalled"
    os.read(fd, 8)  # eventfd: consume the signal


def _objects(count: int, desc: Any = None) -> list[Any]:
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    desc = desc or kit.layout()
    out = []
    for _ in range(count):
        raw = torch.zeros(kit.chunk_bytes(desc), dtype=torch.uint8)
        meta = MemoryObjMetadata(shape=desc.shapes[0], dtype=desc.dtypes[0], address=0,
                                 phy_size=raw.numel(), ref_count=1, pin_count=0,
                                 fmt=MemoryFormat.KV_2LTD, shapes=desc.shapes,
                                 dtypes=desc.dtypes)
        out.append(TensorMemoryObj(raw, meta, None))
    return out


class Listener:
    def __init__(self) -> None:
        self.stored: list[int] = []
        self.accessed = 0
        self.deleted = 0

    def on_l2_keys_stored(self, keys: list[Any], sizes: list[int]) -> None:
        self.stored += sizes

    def on_l2_keys_accessed(self, keys: list[Any]) -> None:
        self.accessed += len(keys)

    def on_l2_keys_deleted(self, keys: list[Any]) -> None:
        self.deleted += len(keys)


def test_adapter_interface_through_the_plugin_factory(cluster) -> None:
    config = PluginL2AdapterConfig.from_dict({
        "module_path": "cellar.integrations.lmcache.l2_adapter", "class_name": "CellarL2Adapter",
        "adapter_params": {"master": cluster.address, "timeout_s": 10}})
    adapter = create_l2_adapter(config)
    assert isinstance(adapter, CellarL2Adapter)
    assert isinstance(adapter.config, CellarL2AdapterConfig)  # found as <class_name>Config
    listener = Listener()
    adapter.register_listener(listener)
    fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(),
           adapter.get_load_event_fd()}
    assert len(fds) == 3
    try:
        keys = kit.keys_for(8, seed=4)
        objs = _objects(8)
        for key, obj in zip(keys, objs, strict=True):
            torch.frombuffer(obj.byte_array, dtype=torch.uint8).copy_(kit.content(key, obj.get_size()))
        size = kit.chunk_bytes()
        task = adapter.submit_store_task(keys[:6], objs[:6])
        _wait_fd(adapter.get_store_event_fd())
        results = adapter.pop_completed_store_tasks()
        assert results[task].is_successful() and results[task].bytes_transferred() == 6 * size
        assert listener.stored == [size] * 6 and adapter.get_usage().total_bytes_used == 6 * size
        assert adapter.pop_completed_store_tasks() == {}

        layouts = {0: kit.layout()}
        task = adapter.submit_lookup_and_lock_task(keys, layouts)
        _wait_fd(adapter.get_lookup_and_lock_event_fd())
        bitmap = adapter.query_lookup_and_lock_result(task)
        assert bitmap is not None and [bitmap.test(i) for i in range(8)] == [True] * 6 + [False] * 2
        assert adapter.query_lookup_and_lock_result(task) is None  # reported once

        dest = _objects(8)
        task = adapter.submit_load_task(keys, dest)
        _wait_fd(adapter.get_load_event_fd())
        bitmap = adapter.query_load_result(task)
        assert bitmap is not None and bitmap.popcount() == 6
        for i in range(6):
            assert torch.equal(torch.frombuffer(dest[i].byte_array, dtype=torch.uint8),
                               kit.content(keys[i], size))
        assert not bool(torch.frombuffer(dest[7].byte_array, dtype=torch.uint8).any())
        assert listener.accessed == 6
        adapter.submit_unlock(keys)

        # The size guard: an object of another size under a reader's name fails that key only.
        fmt = object_format(kit.MODEL, kit.layout(), adapter.config.chunk_size)
        with cellar.connect(cluster.address) as client:
            client.put(object_name(fmt, keys[6]), b"x" * (size // 2))
            client.put(object_name(fmt, keys[7]), b"y" * (size * 2))
        odd = _objects(8)  # the caller keeps load buffers alive until the task completes
        task = adapter.submit_load_task(keys, odd)
        _wait_fd(adapter.get_load_event_fd())
        bitmap = adapter.query_load_result(task)
        assert bitmap is not None and [bitmap.test(i) for i in range(8)] == [True] * 6 + [False] * 2

        adapter.delete(keys[:2])
        assert listener.deleted == 2 and adapter.get_usage().total_bytes_used == 4 * size
        with cellar.connect(cluster.address) as client:
            assert client.exists_many([object_name(fmt, k) for k in keys[:3]]) == [False, False, True]
    finally:
        adapter.close()


def test_documented_server_line_parses_to_the_cellar_adapter() -> None:
    """The `lmcache server` line of docs/engines-lmcache.md, parsed by LMCache's own server
    command, names the Cellar adapter through the `plugin` type."""
    import argparse
    import shlex

    from lmcache.cli.commands.server import ServerCommand
    from lmcache.v1.distributed.config import parse_args_to_config

    doc = (HERE.parents[1] / "docs" / "engines-lmcache.md").read_text()
    section = doc.split("### The lines to copy", 1)[1]
    lines = section.split("lmcache server", 1)[1].split("\n\n", 1)[0].split("\n#", 1)[0]
    argv = shlex.split(lines.replace("\\\n", " "))
    parser = argparse.ArgumentParser()
    ServerCommand().add_arguments(parser)
    args = parser.parse_args(argv)
    (adapter,) = parse_args_to_config(args).l2_adapter_config.adapters
    assert isinstance(adapter, PluginL2AdapterConfig)
    assert (adapter.module_path, adapter.class_name) == ("cellar.integrations.lmcache.l2_adapter",
                                                         "CellarL2Adapter")
    config = CellarL2AdapterConfig.from_dict(adapter.adapter_params)
    assert config.chunk_size == args.chunk_size  # the format's chunk size is the server's
