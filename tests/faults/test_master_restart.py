"""kill -9 the master and restart it on the same address: the nodes re-register, report their
indexes, and every object on a live node is readable again, byte-exact, within 10 s; the
rebuilt allocators never hand out a range an adopted object holds."""

from __future__ import annotations

import signal
import threading
import time
import urllib.request

import numpy as np
import pytest
from faultkit import locations, node_states, raw_stub, wait_until

import cellar
from cellar.errors import Status
from tests.support.faces import FACES, open_face

KIB = 1 << 10


def make_values(prefix: str, count: int, seed: int) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(1, 64 * KIB, count)]
    sizes[::50] = [int(rng.integers(256 * KIB, 1024 * KIB)) for _ in sizes[::50]]
    return {f"{prefix}/{i}": rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            for i, size in enumerate(sizes)}


@pytest.mark.timeout(60)
def test_kill_9_master_restart_rebuilds_from_nodes(fault_cluster, record_property):
    cluster = fault_cluster(nodes=3, segment_size="64MiB", rebuild_grace_s=5)
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        ones = make_values("one", 250, 1)
        twos = make_values("two", 250, 2)
        assert client.put_many(ones, replicas=1) == [Status.OK] * len(ones)
        assert client.put_many(twos, replicas=2) == [Status.OK] * len(twos)
        before = client.status()
        assert before["object_count"] == 500
        old_epoch = before["epoch"]

        cluster.restart_master()
        restarted = time.monotonic()
        keys = list(ones) + list(twos)
        expected = [ones.get(k) or twos[k] for k in keys]
        # Misses answer UNAVAILABLE while the master rebuilds: the SDK retries them.
        got = client.get_many(keys)
        elapsed = time.monotonic() - restarted
        # reported, not gated (performance lives in bench/): the SDK's own timeout bounds it
        record_property("readable_after_restart_s", round(elapsed, 3))
        print(f"500 objects readable {elapsed:.2f}s after the master restart")
        assert got == expected

        after = client.status()
        assert after["epoch"] > old_epoch
        assert after["object_count"] == 500
        assert after["used_bytes"] == before["used_bytes"]
        assert after["tenants"] == before["tenants"]
        assert set(node_states(client).values()) == {"ACTIVE"}
        # replicas=2 objects got both replicas back
        seg_objects = sum(s["object_count"] for s in after["segments"])
        assert seg_objects == 250 + 2 * 250

        # New puts land in free space only: every adopted object stays intact.
        fresh = make_values("fresh", 200, 3)
        assert client.put_many(fresh, replicas=2) == [Status.OK] * len(fresh)
        assert client.get_many(keys) == expected
        assert client.get_many(list(fresh)) == list(fresh.values())
        # A key that never existed is a plain miss once the rebuild window is over.
        wait_until("the rebuild window to end",
                   lambda: client.get_many(["never/was"]) == [None], timeout_s=15)


@pytest.mark.timeout(60)
def test_misses_during_rebuild_are_unavailable_not_not_found(fault_cluster):
    """Right after the restart (nodes said they were mounted before) reads answer UNAVAILABLE,
    which the SDK retries: a client with a short timeout sees cellar.Unavailable, never NotFound
    for a key that may still be reported (nor an old value a later report replaces); existing
    keys read back once the table is whole."""
    cluster = fault_cluster(nodes=2, segment_size="64MiB", rebuild_grace_s=8)
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client, \
            cellar.connect(cluster.address, timeout_s=0.5, transport="tcp") as impatient:
        values = make_values("k", 40, 4)
        assert client.put_many(values) == [Status.OK] * len(values)
        cluster.restart_master()
        with pytest.raises(cellar.Unavailable):
            impatient.get("no/such/key")
        for key, value in values.items():
            assert client.get(key) == value
        wait_until("NotFound after the rebuild window",
                   lambda: client.get_many(["no/such/key"]) == [None], timeout_s=20)
        with pytest.raises(cellar.NotFound):
            impatient.get("no/such/key")


@pytest.mark.timeout(120)
def test_a_put_sent_before_the_nodes_mount_on_a_restarted_master_waits_for_them(fault_cluster):
    """The master is killed and started again while both nodes are stopped (so neither can
    mount for 1.5 s); a 2-replica put sent the moment the new master listens is refused
    UNAVAILABLE ("2 replica(s) asked for but only 0 live node(s)") until they do. The SDK
    places it again, as it does after a leader change: it saw the master's epoch grow, a master
    restart. The put returns OK within its timeout, both replicas were written, and the value
    reads back. Before, the first refusal raised cellar.Unavailable."""
    cluster = fault_cluster(nodes=2, segment_size="64MiB")
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        client.put("restart/before", b"b" * 1000, replicas=2)  # the first master's epoch, seen
        cluster.kill_master()
        for i in range(len(cluster.nodes)):
            cluster.signal_node(i, signal.SIGSTOP)
        cluster.start_master()
        resume = threading.Timer(1.5, lambda: [cluster.signal_node(i, signal.SIGCONT)
                                               for i in range(len(cluster.nodes))])
        resume.start()
        try:
            started = time.monotonic()
            client.put("restart/after", b"a" * 3000, replicas=2)
            waited_s = time.monotonic() - started
        finally:
            resume.join()
        assert waited_s >= 1.0, f"placed after {waited_s:.2f} s, before any node could mount"
        assert client.get("restart/after") == b"a" * 3000
        assert client.get("restart/before") == b"b" * 1000
    channel, stub = raw_stub(cluster)
    with channel:
        replicas = locations(stub, ["restart/after"])["restart/after"]
    assert len({r.node_id for r in replicas}) == 2, replicas


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tenant_log", ["default", "none"])
def test_a_tenant_the_admin_api_created_outlives_a_master_kill(fault_cluster, tenant_log):
    """A tenant created (with quotas) through PUT /api/v1/tenants, not in the config file: after
    a kill -9 of the master and a restart it still exists with those quotas, its token is
    accepted and its objects were adopted from the nodes, byte-exact. Negative control
    (`--tenant-log-file none`): the restarted master does not know the tenant, refuses its
    token's requests as an unknown tenant, and its objects are gone, as every runtime-created
    tenant's were before the tenant log."""
    flags = {} if tenant_log == "default" else {"tenant_log_file": "none"}
    cluster = fault_cluster(nodes=2, segment_size="64MiB", rebuild_grace_s=3, **flags)
    made = cluster.admin_request("PUT", "/api/v1/tenants",
                                 {"name": "acme", "quota_bytes": "32MiB", "quota_objects": 500})
    assert made["quota_bytes"] == 32 << 20 and made["quota_objects"] == 500
    token = cluster.token_for("acme")
    values = make_values("acme", 50, 1)
    with cellar.connect(cluster.address, token=token, tenant="acme", timeout_s=20,
                        transport="tcp") as client:
        assert client.put_many(values) == [Status.OK] * len(values)

    cluster.restart_master()

    def refused_in_rebuild() -> float:
        request = urllib.request.Request(cluster.http_url + "/metrics", headers={
            "Authorization": f"Bearer {cluster.admin_token}"})
        with urllib.request.urlopen(request, timeout=5) as reply:
            text = reply.read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("master_rebuild_objects_refused"))

    tenants = {t["name"]: t for t in cluster.admin_request("GET", "/api/v1/tenants")}
    if tenant_log == "none":
        # every object of the tenant is refused once the nodes have reported
        wait_until("the nodes' reports", lambda: refused_in_rebuild() >= len(values),
                   timeout_s=20)
        assert "acme" not in tenants
        with pytest.raises(cellar.InvalidArgument, match="unknown tenant"), \
                cellar.connect(cluster.address, token=token, tenant="acme", timeout_s=10,
                               transport="tcp") as client:
            client.get_many(list(values))
        # created again, it is empty: the rebuild had no tenant to adopt its objects into
        cluster.admin_request("PUT", "/api/v1/tenants", {"name": "acme"})
        with cellar.connect(cluster.address, token=token, tenant="acme", timeout_s=20,
                            transport="tcp") as client:
            assert client.get_many(list(values)) == [None] * len(values)
        return
    assert tenants["acme"]["quota_bytes"] == 32 << 20
    assert tenants["acme"]["quota_objects"] == 500
    with cellar.connect(cluster.address, token=token, tenant="acme", timeout_s=20,
                        transport="tcp") as client:
        assert client.get_many(list(values)) == list(values.values())
    tenants = {t["name"]: t for t in cluster.admin_request("GET", "/api/v1/tenants")}
    assert tenants["acme"]["objects"] == len(values)
    assert refused_in_rebuild() == 0


@pytest.mark.timeout(120)
def test_a_hard_pin_outlives_a_master_kill(fault_cluster):
    """A hard-pinned object (the tenant has the right, granted through the admin API) is still
    hard-pinned after a kill -9 of the master: the restarted master adopts it from the node
    pinned (the removal log holds its pin record), charges it as hard-pinned, and a flood of
    puts twice the cluster's size evicts other objects, never it. Before, a rebuilt master
    adopted every object unpinned: the flood evicted it (checked below through the tenant's
    hard-pinned bytes, 0 then)."""
    from cellar.client import PutHints

    cluster = fault_cluster(nodes=1, segment_size="32MiB", rebuild_grace_s=2)
    cluster.admin_request("PUT", "/api/v1/tenants", {"name": "default", "hard_pin": True,
                                                     "quota_bytes": "unlimited"})
    pinned = {f"sys/{i}": bytes([i]) * (256 * KIB) for i in range(4)}
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        for key, value in pinned.items():
            client.put(key, value, hints=PutHints(hard_pin=True))
        before = {t["name"]: t for t in cluster.admin_request("GET", "/api/v1/tenants")}

    cluster.restart_master()
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        wait_until("the node's report", lambda: {t["name"]: t for t in cluster.admin_request(
            "GET", "/api/v1/tenants")}["default"]["objects"] == len(pinned), timeout_s=20)
        after = {t["name"]: t for t in cluster.admin_request("GET", "/api/v1/tenants")}
        # not read since the restart: the oldest objects, the first an eviction would take
        flood = np.random.default_rng(5).integers(0, 256, 512 * KIB, dtype=np.uint8).tobytes()
        for i in range(128):  # 64 MiB through a 32 MiB node: eviction runs throughout
            client.put(f"flood/{i}", flood)
        assert client.get_many(["flood/0"]) == [None]  # evicted: the flood did reach them
        assert client.get_many(list(pinned)) == list(pinned.values())
        assert after["default"]["hard_pinned_bytes"] == before["default"]["hard_pinned_bytes"] > 0


def test_a_soft_pin_outlives_a_master_kill(fault_cluster):
    """Soft-pinned objects (a system prompt's pages; two with a TTL, two without) are still
    soft-pinned after a kill -9 of the master: the master told the node each pin and its lapse
    (heartbeat replies), the node journaled them and reports them, and the rebuilt master pins
    the objects again. A flood of plain puts twice the node's size then evicts plain objects,
    never them. Before, a rebuilt master adopted them plain, the oldest objects it held: the
    flood's first evictions took them."""
    from cellar.client import PutHints
    from cellar.storage_node.journal import replay

    cluster = fault_cluster(nodes=1, segment_size="32MiB", rebuild_grace_s=2)
    pinned = {f"sys/{i}": bytes([i]) * (256 * KIB) for i in range(4)}
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        for i, (key, value) in enumerate(pinned.items()):
            client.put(key, value, soft_pin=True,
                       hints=PutHints(soft_pin_ttl_ms=600_000) if i % 2 else None)
    (journal,) = cluster.shm_dir.glob("cellar-*.idx")
    wait_until("the node was told the pins", lambda: sum(
        1 for e in replay(journal.read_bytes())[0].values() if e.soft_pin_until_ms) == 4,
        timeout_s=10)

    cluster.restart_master()
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        wait_until("the node's report", lambda: {t["name"]: t for t in cluster.admin_request(
            "GET", "/api/v1/tenants")}["default"]["objects"] == len(pinned), timeout_s=20)
        flood = np.random.default_rng(6).integers(0, 256, 512 * KIB, dtype=np.uint8).tobytes()
        for i in range(128):  # 64 MiB through a 32 MiB node: eviction runs throughout
            client.put(f"flood/{i}", flood)
        assert client.get_many(["flood/0"]) == [None]  # evicted: the flood did reach them
        assert client.get_many(list(pinned)) == list(pinned.values())


@pytest.mark.timeout(120)
def test_engine_hashes_outlive_node_and_master_kills(fault_cluster):
    """Pages put with the engine's hashes (SGLang's page hashes) are found by the prefix query
    (/query_by_hash) after a kill -9 of both nodes and of the master: the master told each node
    the hash of its replicas (heartbeat replies), the nodes journaled it and report it, and the
    rebuilt master indexes it again. Before, a rebuilt master knew only keys: the query
    answered 0 tokens for everything it held."""
    from cellar.client import PutHints
    from cellar.master.serving.prefix_query import sglang_page_hashes
    from tests.support.http import post_json

    page = 16
    cluster = fault_cluster(nodes=2, segment_size="64MiB", rebuild_grace_s=2)
    token = cluster.token_for("default")
    tokens = [(7919 * i + 13) % 50_000 for i in range(6 * page)]
    hashes = sglang_page_hashes(tokens, page)
    keys = [f"pages/{i}" for i in range(6)]
    body = {"model": "m", "seq_hashes": hashes, "block_size": page, "tenant_id": "default"}

    def matched() -> int:
        status, reply = post_json(cluster, "/query_by_hash", body, token)
        assert status == 200, reply
        return int(reply["default"]["cellar"]["longest_matched"])

    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        client.put_many([(k, bytes([i]) * 4096) for i, k in enumerate(keys)], replicas=2,
                        hints=PutHints(engine_hashes=dict(zip(keys, hashes, strict=True))))
    assert matched() == 6 * page
    time.sleep(1.5)  # five heartbeats (0.3 s): the nodes were told the hashes

    for index in range(2):
        cluster.restart_node(index)
    cluster.restart_master()
    wait_until("the rebuild", lambda: {t["name"]: t for t in cluster.admin_request(
        "GET", "/api/v1/tenants")}["default"]["objects"] == len(keys), timeout_s=20)
    after = matched()
    print(f"after kill -9 of both nodes and the master: {after} of {6 * page} tokens matched")
    assert after == 6 * page
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        assert client.get_many(keys) == [bytes([i]) * 4096 for i in range(6)]


@pytest.mark.parametrize("face", FACES)
@pytest.mark.timeout(60)
def test_a_deadline_get_with_no_master_says_late_not_an_exception(fault_cluster, face):
    """With the master down (killed: connections refused at once), a deadline-bounded
    get_many_into reports every key LATE, as its contract says, rather than raising the
    channel's Unavailable (it did, within 22-303 ms of 50-500 ms budgets, before
    2026-12-06: a prefetch got an exception); an ordinary call still raises once its own
    timeout ends. A fresh reader, so no key is read without asking."""
    cluster = fault_cluster(nodes=1)
    values = {f"k{i}": bytes([i + 1]) * 1000 for i in range(4)}
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as writer:
        assert writer.put_many(values) == [Status.OK] * len(values)
    reader = open_face(face, "tcp", cluster.address, timeout_s=3.0)
    try:
        cluster.kill_master()
        keys, buffers = list(values), [bytearray(1000) for _ in values]
        for budget_s in (0.05, 0.5):
            assert reader.get_many_into(keys, buffers, timeout_s=budget_s) == [cellar.LATE] * 4
            assert reader.get_many_into(keys, buffers, timeout_s=budget_s, prefix=True) == []
        assert buffers == [bytearray(1000)] * 4  # nothing landed
        with pytest.raises(cellar.Unavailable):  # no budget: the client's timeout, then raised
            reader.get_many_into(keys, buffers)
    finally:
        reader.close()
