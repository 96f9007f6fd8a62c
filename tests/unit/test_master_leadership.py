"""Master roles and fencing without etcd: Leadership, the servicer's gate, coord parsing.

The election itself runs against a real etcd in tests/integration/test_ha*.py; here a stand-in
election with a hand-driven lease checks what the master does with its answers.
"""

from __future__ import annotations

import pytest
from test_master_support import EPOCH, SECRET, Entry, FakeClock, make_service, mount, segment_info

from cellar.coord.election import LeaderElection, fence_margin_s
from cellar.coord.redirect import leader_from_details
from cellar.coord.target import EtcdTarget, LeaderRecord, parse_etcd_url
from cellar.errors import ConfigError, InvalidArgument
from cellar.master.config import MasterConfig
from cellar.master.serving.auth import Authorizer
from cellar.master.serving.leadership import Leadership
from cellar.master.serving.servicer import MasterServicer
from cellar.proto import cellar_pb2 as pb
from cellar.tokens import KIND_TENANT, TokenStore

UNAVAILABLE = 14
LEADER = LeaderRecord("m1", "127.0.0.1:7001", "127.0.0.1:8001", 1_800_000_000_000)


class StubElection:
    """Answers holds_lease() from a flag the test flips (the lease on the master's own clock)."""

    def __init__(self) -> None:
        self.lease_valid = False
        self.expected_nodes: frozenset[str] | None = None

    def holds_lease(self) -> bool:
        return self.lease_valid

    def lease_remaining_s(self) -> float:
        return 1.0 if self.lease_valid else 0.0


def ha_leadership() -> tuple[Leadership, StubElection]:
    config = MasterConfig(etcd="127.0.0.1:2379", cluster="c1", new_node_ramp_s=0.0)
    config.validate()
    leadership = Leadership(config, SECRET, ha=True, master_id="m2")
    election = StubElection()
    leadership.election = election  # type: ignore[assignment]
    return leadership, election


STORE = TokenStore(None)  # in memory
TOKEN = STORE.create(KIND_TENANT, "default")[1]


def make_servicer(leadership: Leadership) -> MasterServicer:
    return MasterServicer(leadership, Authorizer(STORE, SECRET))


def put_request(key: str = "k") -> bytes:
    return pb.PutStartRequest(header=pb.RequestHeader(tenant="default", client_id="c", token=TOKEN),
                              items=[pb.PutItem(key=key, size_bytes=4096)]).SerializeToString()


def test_single_master_always_serves() -> None:
    leadership = Leadership(MasterConfig(), SECRET, ha=False)
    assert leadership.serving() and leadership.role == "single"
    assert leadership.epoch == leadership.service.epoch > 0


def test_standby_redirects_every_rpc_but_cluster_status() -> None:
    leadership, _ = ha_leadership()
    leadership.on_leader(LEADER)
    servicer = make_servicer(leadership)
    code, details = servicer.dispatch("PutStart", put_request())
    assert code == UNAVAILABLE
    assert leader_from_details(details.decode()) == LEADER.address
    status = servicer.ClusterStatus(pb.ClusterStatusRequest(), servicer.stats["ClusterStatus"])
    assert (status.role, status.leader_address, status.header.epoch) == ("standby", LEADER.address,
                                                                       LEADER.epoch)
    assert not status.segments


def test_elected_master_serves_until_its_lease_lapses_then_refuses_writes() -> None:
    leadership, election = ha_leadership()
    leadership.on_elected(LEADER.epoch + 1)
    election.lease_valid = True
    servicer = make_servicer(leadership)
    mount(leadership.service, "n1", 1)
    code, body = servicer.dispatch("PutStart", put_request())
    assert code == 0
    reply = pb.PutStartReply.FromString(body)
    assert reply.header.epoch == LEADER.epoch + 1 and reply.results[0].put_id
    assert reply.results[0].replicas[0].grant.epoch == LEADER.epoch + 1
    # Frozen past its lease: the very next request is refused, before any etcd callback ran.
    election.lease_valid = False
    end = pb.PutEndRequest(header=pb.RequestHeader(tenant="default", client_id="c", token=TOKEN),
                           items=[pb.PutEndItem(key="k", put_id=reply.results[0].put_id)])
    code, details = servicer.dispatch("PutEnd", end.SerializeToString())
    assert code == UNAVAILABLE and "not the leader" in details.decode()


def test_a_deposed_leader_forgets_its_metadata() -> None:
    leadership, election = ha_leadership()
    leadership.on_elected(LEADER.epoch)
    election.lease_valid = True
    old = leadership.service
    mount(old, "n1", 1)
    leadership.on_deposed("lease lost")
    assert leadership.service is not old and leadership.role == "standby"
    assert not leadership.service.membership.segments


def test_a_deposed_leaders_frozen_table_is_freed() -> None:
    """The serving master freezes its heap out of the cyclic GC (cellar.master.main); a table is
    full of cycles, so stepping down must hand it back to the collector or it leaks."""
    import gc
    import weakref

    from test_master_support import put

    leadership, election = ha_leadership()
    leadership.on_elected(LEADER.epoch)
    election.lease_valid = True
    mount(leadership.service, "n1", 1)
    leadership.service.grace.over = True
    for i in range(10):
        put(leadership.service, f"k{i}", 100)
    table = weakref.ref(leadership.service.objects)  # in cycles: with its evictor, its objects
    gc.freeze()
    try:
        leadership.on_deposed("lease lost")
        assert table() is None
    finally:
        gc.unfreeze()


def test_takeover_rebuild_ends_once_the_previous_leaders_nodes_reported() -> None:
    clock = FakeClock()
    service = make_service(clock, rebuild_grace_s=60.0)
    service.expect_nodes(frozenset({"n1", "n2"}))
    for node_id, segment_id in (("n1", 1), ("n2", 2)):
        assert service.recovering()  # a miss may still be an object of a node not back yet
        outcome = service.mount_segment(node_id, 1, [segment_info(segment_id, 1 << 26)],
                                        previous_epoch=service.epoch - 1)
        assert outcome.results[0][0] == 0
    assert not service.recovering()  # long before the 60 s grace


def test_takeover_keeps_both_replicas_when_every_node_mounts_before_reporting() -> None:
    """Both nodes of the previous leader mount (their reports to follow) before either
    reports: the grace must not end at the mounts, or the second replica of each object is
    adopted as surplus (its kept count left at one) and the repair queue drops it."""
    from cellar.master.state.ids import ID_EPOCH_SHIFT

    clock = FakeClock()
    service = make_service(clock, rebuild_grace_s=60.0)
    service.expect_nodes(frozenset({"n1", "n2"}))
    for node_id, segment_id in (("n1", 1), ("n2", 2)):
        service.mount_segment(node_id, 1, [segment_info(segment_id, 1 << 26)],
                              previous_epoch=service.epoch - 1, report_follows=True)
    old = (EPOCH - 60_000) << ID_EPOCH_SHIFT
    for node_id, segment_id, alloc_id in (("n1", 1, old + 1), ("n2", 2, old + 2)):
        assert service.recovering()
        out = service.report_objects(node_id, 1, segment_id, [Entry("k", alloc_id, 0, 4096)], last=True)
        assert out.accepted == 1
    obj = service.tenant("").objects["k"]
    assert (len(obj.replicas), obj.wanted) == (2, 2)
    assert not service.recovering()  # every node back and reported: long before 60 s


def test_takeover_without_a_node_list_waits_for_the_grace() -> None:
    clock = FakeClock()
    service = make_service(clock, rebuild_grace_s=5.0)
    service.mount_segment("n1", 1, [segment_info(1, 1 << 26)], previous_epoch=service.epoch - 1)
    assert service.recovering()
    clock.advance(5.0)
    assert not service.recovering()


def test_election_fence_ends_before_the_lease_could_lapse() -> None:
    now = [100.0]
    election = LeaderElection(
        EtcdTarget(("127.0.0.1:2379",), "c1"), LEADER, lease_ttl_s=3, etcd_timeout_s=1.0,
        on_elected=lambda epoch: None, on_deposed=lambda reason: None, on_leader=lambda r: None,
        monotonic=lambda: now[0],
    )
    assert not election.holds_lease()
    election.is_leader = True
    election._deadline = now[0] + 3 - fence_margin_s(3)  # what a keep-alive sent now grants
    assert election.holds_lease()
    now[0] += 3 - fence_margin_s(3)
    assert not election.holds_lease()
    assert 0 < fence_margin_s(3) <= 0.5
    with pytest.raises(ValueError):
        LeaderElection(EtcdTarget(("h:1",), "c"), LEADER, lease_ttl_s=1, etcd_timeout_s=0.5,
                       on_elected=print, on_deposed=print, on_leader=print)


@pytest.mark.parametrize("url", ["etcd://127.0.0.1:2379/c1", "etcd://a:1,b:2/prod-2.x"])
def test_etcd_urls_parse(url: str) -> None:
    target = parse_etcd_url(url)
    assert target.url() == url
    assert target.leader_key == f"/cellar/{target.cluster}/leader"


@pytest.mark.parametrize("url", ["127.0.0.1:2379", "etcd://127.0.0.1:2379", "etcd:///c1",
                                 "etcd://h:99999/c1", "etcd://h:1/bad/name", "etcd://h:1/" + "x" * 65])
def test_bad_etcd_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_etcd_url(url)


def test_leader_records_round_trip_and_reject_garbage() -> None:
    assert LeaderRecord.from_json(LEADER.to_json()) == LEADER
    for raw in (b"[]", b'{"master_id": 1}', b"not json", b'{"master_id":"m","address":"x",'
                b'"http":"","epoch":1}', b"x" * 5000):
        with pytest.raises(ValueError):
            LeaderRecord.from_json(raw)


@pytest.mark.parametrize(("overrides", "field"), [
    ({"etcd": "nohostport"}, "etcd"),
    ({"etcd": "127.0.0.1:2379", "cluster": "bad/name"}, "cluster"),
    ({"etcd": "127.0.0.1:2379", "lease_ttl_s": 1}, "lease_ttl_s"),
    ({"etcd": "127.0.0.1:2379", "advertise": "127.0.0.1:0"}, "advertise"),
    ({"etcd": "127.0.0.1:2379", "etcd_timeout_s": 5.0}, "etcd_timeout_s"),
])
def test_ha_settings_are_checked(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        MasterConfig(**overrides).validate()  # type: ignore[arg-type]
    assert info.value.field == field


def test_an_rpc_cancelled_by_etcd_does_not_end_the_campaign() -> None:
    """grpc.aio raises CancelledError for an RPC the server cancelled (etcd restarting): the
    election must start a new session, not die; only cancelling the task itself stops it."""
    import asyncio

    election = LeaderElection(
        EtcdTarget(("127.0.0.1:2379",), "c1"), LEADER, lease_ttl_s=3, etcd_timeout_s=1.0,
        on_elected=lambda epoch: None, on_deposed=lambda reason: None, on_leader=lambda r: None,
    )
    sessions: list[int] = []

    async def session(stop: asyncio.Event) -> None:
        sessions.append(1)
        if len(sessions) < 3:
            raise asyncio.CancelledError()  # as grpc.aio does for a CANCELLED status
        await asyncio.sleep(3600)

    election._session = session  # type: ignore[method-assign]

    async def scenario() -> None:
        task = asyncio.create_task(election.run(asyncio.Event()))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(sessions) >= 3:
                break
        assert len(sessions) == 3 and not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_a_leader_past_its_lease_says_standby_before_its_loop_notices() -> None:
    """The status (`role`) follows the lease on the master's own clock, as serving does: a
    leader whose election loop has not run since its lease lapsed must not say it leads (the
    HA etcd-outage fault test once asked 3.00 s into an outage of a 3 s lease and read
    "leader")."""
    leadership, election = ha_leadership()
    leadership.on_elected(LEADER.epoch + 1)
    election.lease_valid = True
    assert leadership.role == "leader" and leadership.serving()
    election.lease_valid = False  # no on_deposed yet: the loop sleeps
    assert leadership.service.role == "leader"
    assert leadership.role == "standby" and not leadership.serving()
    assert "(lease lapsed)" in leadership.redirect()


def test_a_leader_past_its_lease_does_not_redirect_to_itself() -> None:
    leadership, election = ha_leadership()
    leadership.on_elected(LEADER.epoch + 1)
    leadership.on_leader(LeaderRecord("m2", "127.0.0.1:7002", "127.0.0.1:8002", LEADER.epoch + 1))
    election.lease_valid = False
    assert leadership.redirect_address() == ""
    assert leader_from_details(leadership.redirect()) == ""
    leadership.on_leader(LEADER)  # a successor appeared in etcd
    assert leadership.redirect_address() == LEADER.address
