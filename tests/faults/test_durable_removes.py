"""An acknowledged remove or upsert survives a kill -9 of the master at once after its reply;
a put refused under a held put-ahead allocation stays refused across a leader kill.

Each round writes values with two replicas (both nodes hold them sealed), upserts a few of them
and removes the others one call at a time, then kills the master with SIGKILL right after the
last acknowledgement (well under a millisecond later, measured and printed; the nodes heartbeat
every 2 s, so they have not heard of the freed ranges). After a restart (single master, the
removal log in a local file) or a failover to the standby (HA, the removal log in etcd), every
removed key is a miss and every upserted key reads its new value. 100 removed keys in all, each
kind. Without the removal log (`--removal-log-file none`, the negative control) removed keys
come back from the nodes' reports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from hakit import ha_cluster, master_stub, takeover_complete, wait_until

import cellar
from cellar.errors import Status

SLOW_HEARTBEATS = {"heartbeat_interval_s": 2, "node_suspect_after_s": 6, "node_expire_after_s": 12,
                   "rebuild_grace_s": 3}
REMOVED_KEYS = 100
UPSERTS_PER_ROUND = 3


def value(key: str, version: int) -> bytes:
    return f"{key}:v{version}:".encode() * 64


def one_round(client: cellar.Client, tag: str, removes: int, pid: int) -> tuple[list[str], list[str], float]:
    """Write, upsert, remove; kill -9 `pid` right after the last remove's reply. Returns the
    removed keys, the upserted keys and the time from the last reply to the kill (s)."""
    removed = [f"{tag}/gone{i}" for i in range(removes)]
    upserted = [f"{tag}/up{i}" for i in range(UPSERTS_PER_ROUND)]
    values = {key: value(key, 1) for key in removed + upserted}
    assert client.put_many(values, replicas=2) == [Status.OK] * len(values)
    for key in upserted:
        client.upsert(key, value(key, 2), replicas=2)
    for key in removed:
        assert client.remove(key) is True
    acked = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    return removed, upserted, time.perf_counter() - acked


def check(client: cellar.Client, removed: list[str], upserted: list[str]) -> None:
    got = client.get_many(removed + upserted)
    back = [key for key, data in zip(removed, got[:len(removed)], strict=True) if data is not None]
    assert back == [], f"{len(back)} removed key(s) came back after the kill: {back[:5]}"
    stale = [key for key, data in zip(upserted, got[len(removed):], strict=True) if data != value(key, 2)]
    assert stale == [], f"upserted keys read an older value or nothing: {stale}"


@pytest.mark.timeout(240)
def test_removes_acknowledged_just_before_a_master_kill_stay_removed(fault_cluster):
    cluster = fault_cluster(nodes=2, segment_size="64MiB", **SLOW_HEARTBEATS)
    rounds, removed_all, upserted_all, gaps = 5, [], [], []
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        for r in range(rounds):
            assert cluster.master is not None and cluster.master.proc is not None
            removed, upserted, gap = one_round(client, f"r{r}", REMOVED_KEYS // rounds,
                                               cluster.master.proc.pid)
            gaps.append(gap)
            cluster.kill_master()  # reaps it
            cluster.start_master()
            removed_all += removed
            upserted_all += upserted
            check(client, removed_all, upserted_all)  # every round's keys, after every restart
    print(f"{len(removed_all)} removes, {len(upserted_all)} upserts; reply-to-kill max "
          f"{max(gaps) * 1e6:.0f} us")
    assert len(removed_all) == REMOVED_KEYS


@pytest.mark.timeout(300)
def test_removes_acknowledged_just_before_a_leader_kill_stay_removed():
    rounds, removed_all, upserted_all, gaps = 4, [], [], []
    with ha_cluster(nodes=2, lease_ttl_s=3, **SLOW_HEARTBEATS) as cluster, \
            cellar.connect(cluster.etcd_url, timeout_s=30, transport="tcp") as client:
        for r in range(rounds):
            old = cluster.leader()
            proc = cluster.masters[old].proc
            assert proc is not None
            removed, upserted, gap = one_round(client, f"h{r}", REMOVED_KEYS // rounds, proc.pid)
            gaps.append(gap)
            cluster.kill_master(old)
            new = 1 - old
            wait_until("the standby to take over", lambda new=new: takeover_complete(cluster, new, 2),
                       timeout_s=30)
            removed_all += removed
            upserted_all += upserted
            check(client, removed_all, upserted_all)
            cluster.start_master(old)  # the next round's standby
            wait_until("the restarted master to stand by",
                       lambda old=old: (cluster.master_status(old) or {}).get("role") == "standby",
                       timeout_s=30)
    print(f"{len(removed_all)} removes, {len(upserted_all)} upserts over {rounds} failovers; "
          f"reply-to-kill max {max(gaps) * 1e6:.0f} us")
    assert len(removed_all) == REMOVED_KEYS


@pytest.mark.timeout(300)
def test_a_removal_log_larger_than_one_grpc_reply_is_read_at_election(tmp_path):
    """The election reads the removal log in pages: 12 values of ~500 KiB (6 MiB, over gRPC's
    4 MiB receive limit; a soak grew one that large in 6 minutes) no longer stop every standby
    from winning, and the bounds in them are in force after the takeover."""
    from cellar.master.serving.removal_log import encode

    with ha_cluster(nodes=1, lease_ttl_s=3) as cluster, \
            cellar.connect(cluster.etcd_url, timeout_s=30, transport="tcp") as client:
        client.put("big-log/kept", b"v")
        prefix = f"/cellar/{cluster.cluster_name}/removals/"
        filler = [("default", f"filler/{i:06d}/" + "x" * 400, 1, "") for i in range(1200)]
        value = encode(filler)
        assert 400_000 < len(value) < 512 * 1024
        etcdctl = os.path.join(os.path.dirname(sys.executable), "etcdctl")
        for i in range(12):
            path = tmp_path / f"v{i}"
            path.write_bytes(value)
            with path.open("rb") as stdin:
                subprocess.run([etcdctl, "--endpoints", cluster.etcd.client_address, "put",
                                f"{prefix}zz-filler-{i:02d}"], stdin=stdin, check=True,
                               capture_output=True, timeout=30)
        old = cluster.leader()
        cluster.kill_master(old)
        wait_until("the standby to take over", lambda: takeover_complete(cluster, 1 - old, 1),
                   timeout_s=60)
        assert client.get("big-log/kept") == b"v"


@pytest.mark.timeout(240)
def test_a_removes_repeat_after_a_failover_answers_as_the_first_call():
    """A Remove's first reply is lost with the leader (kill -9 right after it acted); its
    repeat, the same call (token, client id, request id) carried to the new leader, answers OK
    for the key it removed, as the first call did, and NOT_FOUND for the key it missed. Without
    this the soak counted the key lost ("remove returned False"). Negative control: the same
    remove under another request id (another call) answers NOT_FOUND."""
    from cellar.proto import cellar_pb2 as pb

    with ha_cluster(nodes=2, lease_ttl_s=3, **SLOW_HEARTBEATS) as cluster, \
            cellar.connect(cluster.etcd_url, timeout_s=30, transport="tcp") as client:
        token = cluster.token_for("default")
        client.put("repeat/gone", b"v" * 4096, replicas=2)
        old = cluster.leader()

        def remove(index: int, request_id: int) -> list[int]:
            channel, stub = master_stub(cluster, index)
            with channel:
                header = pb.RequestHeader(token=token, client_id="repeat-client",
                                          request_id=request_id)
                reply = stub.Remove(pb.KeysRequest(header=header,
                                                   keys=["repeat/gone", "repeat/never"]), timeout=30)
                return [r.status for r in reply.results]

        first = remove(old, 41)
        assert first == [Status.OK, Status.NOT_FOUND]
        cluster.kill_master(old)
        new = 1 - old
        wait_until("the standby to take over", lambda: takeover_complete(cluster, new, 2), timeout_s=30)
        assert remove(new, 42) == [Status.NOT_FOUND, Status.NOT_FOUND]  # another call
        assert remove(new, 41) == first  # the repeat
        assert client.get_many(["repeat/gone"]) == [None]


def test_a_put_refused_under_a_held_allocation_stays_refused_after_a_leader_kill():
    # The removal log in etcd carries the refused write's allocation as a dead write, so the
    # standby's rebuild does not take the node's sealed copy (newer than the acknowledged
    # value) for the key's newest version (tests/integration/test_sdk_put_ahead.py: the same
    # over a single master's file log).
    size = 64 << 10
    with ha_cluster(nodes=1, lease_ttl_s=3, **SLOW_HEARTBEATS) as cluster, \
            cellar.connect(cluster.etcd_url, timeout_s=30, transport="tcp") as client:
        acked, refused = os.urandom(size), os.urandom(size)
        client.put("k", acked)
        for i in range(3):  # from the second put of the size on, allocations are held
            client.put(f"fill{i}", os.urandom(size))
        with pytest.raises(cellar.AlreadyExists):
            client.put("k", refused)
        old = cluster.leader()
        cluster.kill_master(old)
        wait_until("the standby to take over", lambda: takeover_complete(cluster, 1 - old, 1),
                   timeout_s=30)
        assert client.get("k") == acked


@pytest.mark.timeout(180)
def test_a_remove_the_leader_could_not_make_durable_leaves_the_value_for_its_successor():
    """etcd dies under the leader; removes and upserts it applies in memory cannot be written
    to the removal log, so each is refused (UNAVAILABLE or a timeout), not acknowledged. The
    nodes heartbeat several times meanwhile. Then the leader is killed and etcd comes back: the
    standby rebuilds from the nodes' reports and the removal log, and, since none of those
    changes happened for it, every removed key reads its old value byte-exact and a repeat of
    the remove answers True. Before the ranges of such a change waited for the log, the
    heartbeat replies told the nodes to free them: the values vanished and the repeat answered
    False (make soak-ha: one "unexplained loss" in ten minutes)."""
    removed = [f"undurable/rm/{i}" for i in range(6)]
    upserted = [f"undurable/up/{i}" for i in range(4)]
    keys = removed + upserted
    with ha_cluster(nodes=2, lease_ttl_s=8) as cluster, \
            cellar.connect(cluster.etcd_url, timeout_s=30, transport="tcp") as client, \
            cellar.connect(cluster.etcd_url, timeout_s=1.5, transport="tcp") as impatient:
        leader = cluster.leader()
        wait_until("the takeover", lambda: takeover_complete(cluster, leader, 2))
        assert client.put_many({k: value(k, 0) for k in keys}, replicas=2) == [Status.OK] * len(keys)
        before = client.get_many(keys)
        assert before == [value(k, 0) for k in keys]

        assert cluster.etcd is not None
        cluster.etcd.stop(kill=True)
        refused = 0
        for key in removed:
            with pytest.raises((cellar.Unavailable, cellar.Timeout)):
                impatient.remove(key)
            refused += 1
        for key in upserted:
            with pytest.raises((cellar.Unavailable, cellar.Timeout)):
                impatient.put(key, value(key, 1), replicas=2)
            refused += 1
        time.sleep(3.5)  # three heartbeats (1 s each): the nodes would have heard of frees
        cluster.kill_master(leader)
        cluster.etcd.start()
        new = 1 - leader
        wait_until("the standby to take over", lambda: takeover_complete(cluster, new, 2),
                   timeout_s=60)
        after = client.get_many(removed)
        print(f"{refused} changes refused during the etcd outage; after the failover "
              f"{sum(v is not None for v in after)}/{len(removed)} removed keys still hold "
              "their value")
        assert after == [value(k, 0) for k in removed]
        for key in upserted:  # the old value or the new one (it was sealed), never neither
            assert client.get(key) in (value(key, 0), value(key, 1)), key
        assert [client.remove(k) for k in removed] == [True] * len(removed)
        assert client.get_many(removed) == [None] * len(removed)
