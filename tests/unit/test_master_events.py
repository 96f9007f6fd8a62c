"""The master's event log as Leadership feeds it: node expiries seen from the tick, elections."""

from __future__ import annotations

from test_master_support import SECRET, mount, put

from cellar.master.config import MasterConfig
from cellar.master.serving.leadership import Leadership


def test_expired_node_is_logged_once_with_its_replicas() -> None:
    leadership = Leadership(MasterConfig(new_node_ramp_s=0.0), SECRET, ha=False)
    service = leadership.service
    mount(service, "n1", 1)
    mount(service, "n2", 2)
    for i in range(6):
        put(service, f"k{i}", 4096)
    leadership.tick()
    held = sum(len(s.objects) for s in service.membership.nodes["n1"].segments.values())
    assert leadership.events.recent() == []
    service.expire_node(service.membership.nodes["n1"])
    leadership.tick()
    leadership.tick()
    events = leadership.events.recent()
    assert [e.kind for e in events] == ["node_expired"]
    assert events[0].message == f"node n1 expired: its {held} replica(s) dropped"


def test_election_and_deposition_are_logged_newest_first() -> None:
    config = MasterConfig(etcd="127.0.0.1:2379", cluster="c1")
    config.validate()
    leadership = Leadership(config, SECRET, ha=True, master_id="m1")
    leadership.on_elected(1_800_000_000_000)
    leadership.on_deposed("lease lost")
    kinds = [e.kind for e in leadership.events.recent()]
    assert kinds == ["deposed", "elected"]
    assert "1800000000000" in leadership.events.recent()[1].message
