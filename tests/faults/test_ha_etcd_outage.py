"""etcd goes away under a leader.

Briefly (shorter than the lease): the leader keeps serving reads and writes, since serving needs
no etcd; nobody can be elected meanwhile; when etcd is back the same master leads under the same
epoch and nothing was lost. Longer than the lease: the leader stops serving within its lease on
its own clock (it cannot vouch that no one else leads), and once etcd is back a leader is elected
under a newer epoch and every acknowledged object is still there, byte-exact."""

from __future__ import annotations

import time

import pytest
from hakit import ha_cluster, status, takeover_complete, wait_until

import cellar
from cellar.bench.failover import payload
from cellar.errors import Status

BRIEF_TTL_S = 8          # room for etcd's own restart (~1.5 s) plus the masters' reconnect
BRIEF_DOWN_S = 1.5       # etcd is dead this long before it is started again
LONG_TTL_S = 3
NODES = 2


def check_all(client: cellar.Client, keys: list[str]) -> None:
    got = client.get_many(keys)
    missing = [k for k, v in zip(keys, got, strict=True) if v is None]
    corrupt = [k for k, v in zip(keys, got, strict=True) if v is not None and v != payload(k)]
    assert missing == [] and corrupt == [], (missing[:5], corrupt[:5])


@pytest.mark.timeout(120)
def test_brief_etcd_outage_changes_nothing():
    with ha_cluster(nodes=NODES, lease_ttl_s=BRIEF_TTL_S) as cluster, \
            cellar.connect(cluster.address, timeout_s=10) as client:
        leader = cluster.leader()
        standby = 1 - leader
        before = wait_until("the takeover", lambda: takeover_complete(cluster, leader, NODES))
        keys = [f"pre/{i}" for i in range(200)]
        assert client.put_many({k: payload(k) for k in keys}) == [Status.OK] * len(keys)

        assert cluster.etcd is not None
        cluster.etcd.stop(kill=True)
        down_at = time.monotonic()
        # Serving goes on without etcd: writes and reads through the same leader.
        during = [f"during/{i}" for i in range(50)]
        for key in during:
            client.put(key, payload(key))
        check_all(client, keys + during)
        mid = status(cluster, leader)
        assert mid["role"] == "leader" and mid["epoch"] == before["epoch"], mid
        assert status(cluster, standby)["role"] == "standby"
        time.sleep(max(0.0, BRIEF_DOWN_S - (time.monotonic() - down_at)))
        cluster.etcd.start()
        print(f"etcd was down {time.monotonic() - down_at:.2f}s "
              f"(lease {BRIEF_TTL_S}s; leader had {mid['lease_remaining_s']:.2f}s left mid-outage)")

        # The lease is renewed again (more left than could remain without a renewal) ...
        renewed_floor_s = BRIEF_TTL_S - (time.monotonic() - down_at)
        wait_until("the leader's lease to be renewed", lambda: status(cluster, leader).get(
            "lease_remaining_s", 0) > renewed_floor_s + 0.5, timeout_s=BRIEF_TTL_S)
        # ... and no election happened: same leader, same epoch, the standby still follows it.
        after = status(cluster, leader)
        assert after["role"] == "leader" and after["epoch"] == before["epoch"]
        assert after["elections_won"] == before["elections_won"]
        other = status(cluster, standby)
        assert other["role"] == "standby"
        assert (other.get("leader") or {}).get("epoch") == before["epoch"]
        assert client.master_address == cluster.masters[leader].address
        check_all(client, keys + during)
        client.put("after", payload("after"))
        check_all(client, ["after"])


@pytest.mark.timeout(120)
def test_long_etcd_outage_deposes_then_recovers():
    with ha_cluster(nodes=NODES, lease_ttl_s=LONG_TTL_S) as cluster, \
            cellar.connect(cluster.address, timeout_s=30) as client, \
            cellar.connect(cluster.address, timeout_s=0.5) as impatient:
        leader = cluster.leader()
        before = wait_until("the takeover", lambda: takeover_complete(cluster, leader, NODES))
        keys = [f"pre/{i}" for i in range(200)]
        assert client.put_many({k: payload(k) for k in keys}) == [Status.OK] * len(keys)

        assert cluster.etcd is not None
        cluster.etcd.stop(kill=True)
        down_at = time.monotonic()  # etcd is dead: the last renewal was before this
        # The leader stops serving on its own within its lease: it never says it leads to a
        # question asked after the lease could have lapsed (down_at + TTL). Order, not speed:
        # a late answer of "leader" to an early question is fine, any to a late one is not.
        last_leader_ask_s = None
        while True:
            asked_s = time.monotonic() - down_at
            if status(cluster, leader).get("role") != "leader":
                break
            last_leader_ask_s = asked_s
            assert asked_s < LONG_TTL_S + 30, "the leader never stopped serving"
            time.sleep(0.05)
        stepped_down_s = time.monotonic() - down_at
        print(f"leader stepped down {stepped_down_s:.2f}s into the etcd outage (lease {LONG_TTL_S}s; "
              f"last seen leading when asked {last_leader_ask_s}s in)")
        assert last_leader_ask_s is None or last_leader_ask_s <= LONG_TTL_S, (
            f"the leader said it leads when asked {last_leader_ask_s:.2f}s into the outage, "
            f"past its {LONG_TTL_S}s lease")
        # ... so nothing is served: no master can vouch for its leadership.
        with pytest.raises((cellar.Unavailable, cellar.Timeout)):
            impatient.put("refused", payload("refused"))
        assert "leader" not in cluster.roles()
        time.sleep(max(0.0, LONG_TTL_S + 1.0 - (time.monotonic() - down_at)))

        cluster.etcd.start()
        new = cluster.leader(timeout_s=30)
        after = wait_until("a new takeover", lambda: takeover_complete(cluster, new, NODES),
                           timeout_s=30)
        print(f"master-{new} leads again {time.monotonic() - down_at:.2f}s after etcd went down, "
              f"recovered {after['takeover'].get('recovered_objects')} objects")
        assert after["epoch"] > before["epoch"]
        check_all(client, keys)
        assert client.get_many(["refused"]) == [None]
        client.put("after", payload("after"))
        check_all(client, ["after"])
