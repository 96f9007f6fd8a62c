"""Mooncake 0.3.13 behaviours through `cellar.compat.mooncake`, written from Mooncake's API
reference and its own Python tests (mooncake-wheel/tests/test_distributed_object_store.py):
the names its test file imports, SoftPinAction with a TTL that lapses, a hard pin, preferred
segments and local-first allocation as placement, get_hostname's "host:port", and the tear-down
of a store's own segment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from mooncake_helpers import setup_args

from cellar.compat.mooncake import MooncakeDistributedStore, ReplicateConfig, SoftPinAction
from cellar.compat.mooncake.node import free_port
from cellar.compat.mooncake.shim import write_shim

MIB = 1 << 20
OK, INVALID, ILLEGAL_CLIENT = 0, -600, -601


def _store(cluster: Any, **kwargs: Any) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    assert store.setup(*setup_args(cluster, **kwargs)) == OK
    return store


def _objects_by_node(client: Any) -> dict[str, int]:
    return {n["node_id"]: int(n["object_count"]) for n in client.status()["nodes"]}


def test_mooncake_test_file_imports_resolve(tmp_path):
    """Mooncake's test file starts `from mooncake.store import MooncakeDistributedStore,
    SoftPinAction`: through the opt-in shim that line loads."""
    write_shim(tmp_path)
    code = ("from mooncake.store import MooncakeDistributedStore, SoftPinAction, "
            "ReplicateConfig; c = ReplicateConfig(); "
            "assert c.soft_pin_action == SoftPinAction.PRESERVE and c.soft_pin_ttl_ms is None; "
            "print(int(SoftPinAction.ENABLE), int(SoftPinAction.DISABLE))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}"
                                                            f"{os.environ.get('PYTHONPATH', '')}"},
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "2"]


def test_soft_pin_config_forwarding(mc_cluster, new_store):
    """Mooncake's test_soft_pin_config_forwarding, as codes."""
    store = new_store()
    key = f"sp-forward-{os.getpid()}"
    enable = ReplicateConfig()
    enable.soft_pin_action, enable.soft_pin_ttl_ms = SoftPinAction.ENABLE, 1000
    assert store.put(key, b"soft-pin forwarding", enable) == OK
    preserve_with_ttl = ReplicateConfig()
    preserve_with_ttl.soft_pin_ttl_ms = 1000
    assert store.upsert(key, b"x", preserve_with_ttl) == INVALID
    disable_with_ttl = ReplicateConfig()
    disable_with_ttl.soft_pin_action, disable_with_ttl.soft_pin_ttl_ms = SoftPinAction.DISABLE, 1000
    assert store.upsert(key, b"x", disable_with_ttl) == INVALID
    assert store.upsert(key, b"y") == OK
    disable = ReplicateConfig()
    disable.soft_pin_action = SoftPinAction.DISABLE
    assert store.upsert(key, b"z", disable) == OK
    assert store.get(key) == b"z"


def test_soft_pin_lapses_after_its_ttl(make_cluster):
    """ENABLE with soft_pin_ttl_ms: evicted only in the second pass until the TTL lapses, then
    ordinary cache; ENABLE without a TTL (Mooncake's 30-minute default) still holds."""
    cluster = make_cluster(nodes=1, segment_size=32 * MIB)
    store = _store(cluster, local_buffer="2MB")
    lapsing, lasting = ReplicateConfig(), ReplicateConfig()
    lapsing.soft_pin_action, lapsing.soft_pin_ttl_ms = SoftPinAction.ENABLE, 500
    lasting.soft_pin_action = SoftPinAction.ENABLE
    page = os.urandom(MIB)
    short = [f"lapse/{i}" for i in range(6)]
    long = [f"last/{i}" for i in range(6)]
    for a, b in zip(short, long, strict=True):  # interleaved: the same age
        assert store.put(a, page, lapsing) == OK
        assert store.put(b, page, lasting) == OK
    time.sleep(1.5)  # the short TTL lapses (the master sweeps lapses on every tick)
    for i in range(3 * 32):  # three times the capacity, unpinned
        assert store.put(f"fill/{i}", page) == OK
    assert store.batch_is_exist(long) == [1] * len(long)
    assert sum(store.batch_is_exist(short)) <= 2  # lapsed: evicted like the fill
    store.close()


def test_hard_pin_needs_the_tenant_right_and_then_holds(make_cluster):
    cluster = make_cluster(nodes=1, segment_size=32 * MIB)
    store = _store(cluster, local_buffer="2MB")
    hard = ReplicateConfig()
    hard.with_hard_pin = True
    page = os.urandom(MIB)
    assert store.put("hard/refused", page, hard) == ILLEGAL_CLIENT  # Cellar: an admin's grant
    cluster.admin_request("PUT", "/api/v1/tenants", {"name": "default", "hard_pin": True})
    pinned = [f"hard/{i}" for i in range(4)]
    assert store.put_batch(pinned, [page] * len(pinned), hard) == OK
    for i in range(3 * 32):
        assert store.put(f"fill/{i}", page) == OK
    assert store.batch_is_exist(pinned) == [1] * len(pinned)
    store.close()


def test_preferred_segment_places_on_that_segments_host(make_cluster, connect_to):
    cluster = make_cluster(nodes=0)
    cluster.add_node(host_id="host-a", node_id="node-a")
    cluster.add_node(host_id="host-b", node_id="node-b")
    admin = connect_to(cluster)
    tcp = {n["node_id"]: n["endpoints"]["tcp"] for n in admin.status()["nodes"]}
    store = _store(cluster)
    for target in ("node-b", "node-a"):
        cfg = ReplicateConfig()
        cfg.preferred_segment = tcp[target]  # a segment's "host:port", as Mooncake names it
        before = _objects_by_node(admin)
        keys = [f"pref/{target}/{i}" for i in range(8)]
        assert store.put_batch(keys, [b"v" * 4096] * len(keys), cfg) == OK
        after = _objects_by_node(admin)
        assert after[target] - before[target] == len(keys)
    nowhere = ReplicateConfig()
    nowhere.preferred_segments = ["10.255.255.1:1"]  # no such segment: placed as usual
    assert store.put("pref/nowhere", b"v", nowhere) == OK
    store.close()


def test_local_first_allocation_and_own_segment_name(make_cluster, connect_to, monkeypatch):
    """prefer_alloc_in_same_node, and preferred_segment = get_hostname() (Mooncake's API
    reference example), put the object in this store's own segment."""
    cluster = make_cluster(nodes=0)
    cluster.add_node(host_id="elsewhere", node_id="node-far")
    monkeypatch.setenv("CELLAR_CLUSTER_SECRET", cluster.secret)
    admin = connect_to(cluster)
    store = _store(cluster, segment="16MB")
    own = store.embedded_node
    assert own is not None
    local, named = ReplicateConfig(), ReplicateConfig()
    local.prefer_alloc_in_same_node = True
    named.preferred_segment = store.get_hostname()
    for cfg, tag in ((local, "local"), (named, "named")):
        before = _objects_by_node(admin)[own.node_id]
        keys = [f"{tag}/{i}" for i in range(8)]
        assert store.put_batch(keys, [b"v" * 4096] * len(keys), cfg) == OK
        assert _objects_by_node(admin)[own.node_id] - before == len(keys)
    store.close()


def test_get_hostname_is_host_and_port(make_cluster, connect_to, monkeypatch):
    """No port given: "host:port" with a port picked in 12300..14300, where the store's own
    segment (the embedded node) listens; a given port is kept."""
    cluster = make_cluster(nodes=0)
    monkeypatch.setenv("CELLAR_CLUSTER_SECRET", cluster.secret)
    admin = connect_to(cluster)
    store = _store(cluster, segment="8MB")
    host, port = store.get_hostname().split(":")
    assert host == "127.0.0.1" and 12300 <= int(port) <= 14300
    (node,) = admin.status()["nodes"]
    assert node["endpoints"]["tcp"].endswith(f":{port}")
    store.close()
    assert store.get_hostname() == ""
    given = free_port("127.0.0.1", 20000, 30000)
    store = MooncakeDistributedStore()
    assert store.setup(f"127.0.0.1:{given}", "P2PHANDSHAKE", 0, "16MB", "tcp", "",
                       cluster.address) == OK
    assert store.get_hostname() == f"127.0.0.1:{given}"
    store.close()


def test_client_tear_down(make_cluster, monkeypatch):
    """Mooncake's test_client_tear_down: what the store held in its own segment is gone after
    close() and setup() again; the store works again."""
    cluster = make_cluster(nodes=0)  # the store's segment is the cluster's only memory
    monkeypatch.setenv("CELLAR_CLUSTER_SECRET", cluster.secret)
    store = _store(cluster, segment="16MB")
    assert store.put("test_teardown_key", b"Hello, World!") == OK
    assert store.close() == 0
    time.sleep(1)
    assert store.setup(*setup_args(cluster, segment="16MB")) == OK
    assert store.get("test_teardown_key") == b""
    assert store.put("test_teardown_key", b"Hello, World!") == OK
    assert store.get("test_teardown_key") == b"Hello, World!"
    store.close()
