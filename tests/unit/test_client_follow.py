"""The SDK follows the master leader (client/rpc.py): redirects, etcd as the authority, the
epoch fence across a change, the fast line's redirects, and etcd:// addresses. Fake masters
stand in for gRPC (no processes, no etcd)."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

import cellar
from cellar.client import probe, rpc, sync
from cellar.coord import follow
from cellar.coord.redirect import LEADER_METADATA, redirect_details
from cellar.devtools.ports import free_port
from cellar.proto import cellar_pb2 as pb


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, metadata: tuple[Any, ...] = ()) -> None:
        super().__init__(details)
        self._code, self._details, self._metadata = code, details, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[Any, ...]:
        return self._metadata


class FakeMaster:
    """role "leader" serves; "standby" redirects (metadata and/or details); "dead" refuses."""

    def __init__(self, address: str, role: str = "leader", epoch: int = 10, leader: str = "",
                 metadata: bool = True, fast_port: int = 0) -> None:
        self.address, self.role, self.epoch, self.leader = address, role, epoch, leader
        self.metadata = metadata
        self.fast_port = fast_port
        self.calls: list[str] = []

    def answer(self, method: str) -> Any:
        self.calls.append(method)
        if self.role == "dead":
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
        header = pb.ReplyHeader(epoch=self.epoch)
        if method == "ClusterStatus":
            return pb.ClusterStatusReply(header=header, role=self.role, leader_address=self.leader)
        if self.role == "standby":
            metadata = ((LEADER_METADATA, self.leader),) if self.metadata else ()
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE,
                               redirect_details(self.address, "standby", self.leader, self.epoch),
                               metadata)
        if self.role == "bad":
            raise FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "bad key")
        return pb.ClusterStatusReply(header=header)


class FakeCall:
    def __init__(self, metadata: tuple[Any, ...]) -> None:
        self._metadata = metadata

    def trailing_metadata(self) -> tuple[Any, ...]:
        return self._metadata


class FakeMethod:
    def __init__(self, master: FakeMaster, method: str) -> None:
        self.master, self.method = master, method

    def __call__(self, request: Any, timeout: float) -> Any:
        return self.master.answer(self.method)

    def future(self, request: Any, timeout: float) -> FakeFuture:
        return FakeFuture(self.master, self.method, timeout)

    def with_call(self, request: Any, timeout: float) -> tuple[Any, FakeCall]:
        reply = self.master.answer(self.method)
        port = self.master.fast_port
        return reply, FakeCall(((rpc.FAST_PORT_METADATA, str(port)),) if port else ())


class FakeFuture(FakeCall):
    """What `rpc.future()` returns; a "frozen" master never answers (SIGSTOP, a partition)."""

    def __init__(self, master: FakeMaster, method: str, timeout: float) -> None:
        port = master.fast_port
        super().__init__(((rpc.FAST_PORT_METADATA, str(port)),) if port else ())
        self.master, self.method = master, method
        self.expires = time.monotonic() + timeout
        self.cancelled = False

    def result(self, timeout: float) -> Any:
        if self.master.role == "frozen":
            self.master.calls.append(self.method)
            if time.monotonic() >= self.expires:
                raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            time.sleep(max(0.0, min(timeout, self.expires - time.monotonic())))
            raise grpc.FutureTimeoutError()
        return self.master.answer(self.method)

    def cancel(self) -> None:
        self.cancelled = True


class FakeStub:
    def __init__(self, master: FakeMaster) -> None:
        self.master = master

    def __getattr__(self, method: str) -> FakeMethod:
        return FakeMethod(self.master, method)


class FakeChannel:
    closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def masters(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeMaster]:
    """address -> fake master; an address nobody registered is a dead one."""
    table: dict[str, FakeMaster] = {}

    class FakeLine:
        def __init__(self, address: str, generation: int) -> None:
            self.address = address
            self.channel = FakeChannel()
            self.stub = FakeStub(table.setdefault(address, FakeMaster(address, "dead")))
            self.generation = generation
            self.failing_since = 0.0
            self.tls_ca = None  # as rpc._Line: plaintext unless a CA is known for the address

    monkeypatch.setattr(rpc, "_Line", FakeLine)
    return table


def soon(seconds: float = 2.0) -> float:
    return time.monotonic() + seconds


def test_a_standby_redirect_in_trailing_metadata_is_followed(masters):
    masters["s:1"] = FakeMaster("s:1", "standby", leader="l:1")
    masters["l:1"] = FakeMaster("l:1")
    channel = rpc.MasterChannel("s:1", fast=False)
    reply = channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())
    assert reply.header.epoch == 10
    assert channel.address == "l:1" and channel.switches == 1 and channel.generation == 1
    assert masters["l:1"].calls == ["Remove"]


def test_a_redirect_in_the_details_alone_is_followed(masters):
    masters["s:1"] = FakeMaster("s:1", "standby", leader="l:1", metadata=False)
    masters["l:1"] = FakeMaster("l:1")
    channel = rpc.MasterChannel("s:1", fast=False)
    channel.call("Exists", pb.KeysRequest(keys=["k"]), soon())
    assert channel.address == "l:1"


def test_cluster_status_of_a_standby_is_a_redirect_unless_asked_not_to_follow(masters):
    masters["s:1"] = FakeMaster("s:1", "standby", leader="l:1")
    masters["l:1"] = FakeMaster("l:1")
    following = rpc.MasterChannel("s:1", fast=False)
    assert following.call("ClusterStatus", pb.ClusterStatusRequest(), soon()).role == "leader"
    probe = rpc.MasterChannel("s:1", fast=False, follow=False)
    reply = probe.call("ClusterStatus", pb.ClusterStatusRequest(), soon())
    assert reply.role == "standby" and reply.leader_address == "l:1" and probe.address == "s:1"


def test_a_standby_that_knows_no_leader_fails_after_the_deadline(masters, record_property):
    """Retried with backoff until the deadline, then Unavailable naming the refusal; the
    backoff's bounds (never past the deadline) are pinned in test_coord_link.py."""
    masters["s:1"] = FakeMaster("s:1", "standby", leader="")
    channel = rpc.MasterChannel("s:1", fast=False)
    started = time.monotonic()
    with pytest.raises(cellar.Unavailable, match="leader=\\?"):
        channel.call("Remove", pb.KeysRequest(keys=["k"]), soon(0.3))
    record_property("gave_up_after_s", round(time.monotonic() - started, 3))
    assert 2 <= len(masters["s:1"].calls) <= rpc.MAX_RPC_ATTEMPTS  # retried, and bounded
    assert channel.address == "s:1" and channel.switches == 0


def test_a_malformed_redirect_is_ignored(masters):
    masters["s:1"] = FakeMaster("s:1", "standby", leader="not an address")
    channel = rpc.MasterChannel("s:1", fast=False)
    with pytest.raises(cellar.Unavailable):
        channel.call("Remove", pb.KeysRequest(keys=["k"]), soon(0.2))
    assert channel.switches == 0


def test_etcd_is_the_authority_over_a_redirect(masters):
    masters["s:1"] = FakeMaster("s:1", "standby", leader="stale:1")
    masters["l:2"] = FakeMaster("l:2", epoch=20)
    asked: list[float] = []

    def resolve(timeout_s: float) -> str:
        asked.append(timeout_s)
        return "l:2"

    channel = rpc.MasterChannel("s:1", fast=False, resolve=resolve)
    assert channel.call("Remove", pb.KeysRequest(keys=["k"]), soon()).header.epoch == 20
    assert channel.address == "l:2" and len(asked) == 1
    assert 0 < asked[0] <= rpc.RESOLVE_TIMEOUT_S
    assert "stale:1" not in masters


def test_an_unreachable_etcd_falls_back_to_the_redirect(masters):
    masters["s:1"] = FakeMaster("s:1", "standby", leader="l:1")
    masters["l:1"] = FakeMaster("l:1")

    def resolve(timeout_s: float) -> str:
        raise cellar.Unavailable("etcd unreachable")

    channel = rpc.MasterChannel("s:1", fast=False, resolve=resolve)
    channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())
    assert channel.address == "l:1"


def test_etcd_lookups_are_rate_limited_during_an_election(masters, record_property):
    """Every failed attempt would ask etcd; the lookups are spaced by the interval instead
    (a lower bound on the gaps, which a slow machine cannot break)."""
    masters["old:1"] = FakeMaster("old:1", "dead")
    asked: list[float] = []

    def resolve(timeout_s: float) -> str:
        asked.append(time.monotonic())
        return ""  # no leader yet

    channel = rpc.MasterChannel("old:1", fast=False, resolve=resolve)
    with pytest.raises(cellar.Unavailable):
        channel.call("Remove", pb.KeysRequest(keys=["k"]), soon(0.6))
    record_property("lookups", len(asked))
    assert len(asked) >= 1 and len(asked) < len(masters["old:1"].calls)
    assert all(b - a >= rpc.RESOLVE_MIN_INTERVAL_S for a, b in zip(asked, asked[1:], strict=False))


def test_a_dead_leader_is_replaced_by_the_one_etcd_names_within_the_deadline(masters):
    masters["a:1"] = FakeMaster("a:1", epoch=10)
    masters["b:1"] = FakeMaster("b:1", "standby", leader="a:1", epoch=10)
    leader = {"address": "a:1"}
    channel = rpc.MasterChannel("a:1", fast=False, resolve=lambda _t: leader["address"])
    channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())
    masters["a:1"].role = "dead"                      # kill -9 the leader ...
    leader["address"] = ""                            # ... an election runs ...
    masters["b:1"].role, masters["b:1"].epoch = "leader", 30

    def elected() -> None:
        leader["address"] = "b:1"

    import threading

    threading.Timer(0.3, elected).start()
    reply = channel.call("Remove", pb.KeysRequest(keys=["k"]), soon(3.0))
    assert reply.header.epoch == 30 and channel.address == "b:1"
    assert channel._fence.highest == 30


def test_the_fence_refuses_an_older_epoch_after_a_change(masters):
    masters["s:1"] = FakeMaster("s:1", "standby", leader="new:1")
    masters["new:1"] = FakeMaster("new:1", epoch=50)
    channel = rpc.MasterChannel("s:1", fast=False)
    channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())
    assert channel._fence.highest == 50
    masters["new:1"].epoch = 40                       # a deposed leader answering
    with pytest.raises(cellar.Unavailable, match="older than 50"):
        channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())


def test_with_etcd_a_fenced_reply_is_retried_at_the_leader_etcd_names(masters):
    masters["old:1"] = FakeMaster("old:1", epoch=50)
    masters["new:1"] = FakeMaster("new:1", epoch=60)
    leader = {"address": "old:1"}
    channel = rpc.MasterChannel("old:1", fast=False, resolve=lambda _t: leader["address"])
    channel._fence.check(55, "somewhere")             # heard from a newer leader already
    leader["address"] = "new:1"
    reply = channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())
    assert reply.header.epoch == 60 and channel.address == "new:1"


def test_without_etcd_a_silent_master_rotates_to_the_others_it_knew(masters, monkeypatch):
    monkeypatch.setattr(follow, "ROTATE_AFTER_S", 0.1)
    masters["s:1"] = FakeMaster("s:1", "standby", leader="l:1")
    masters["l:1"] = FakeMaster("l:1", epoch=10)
    channel = rpc.MasterChannel("s:1", fast=False)
    channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())
    assert channel.address == "l:1"
    masters["l:1"].role = "dead"                      # the leader dies; s:1 takes over
    masters["s:1"].role, masters["s:1"].epoch = "leader", 20
    reply = channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())
    assert reply.header.epoch == 20 and channel.address == "s:1"


def test_non_retryable_errors_are_not_redirected(masters):
    masters["l:1"] = FakeMaster("l:1", "bad")
    channel = rpc.MasterChannel("l:1", fast=False, resolve=lambda _t: "x:1")
    with pytest.raises(cellar.InvalidArgument):
        channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())
    assert channel.switches == 0


def test_switching_retires_the_old_channel_and_drops_the_fast_line(masters):
    masters["s:1"] = FakeMaster("s:1", "standby", leader="l:1")
    masters["l:1"] = FakeMaster("l:1")
    channel = rpc.MasterChannel("s:1", fast=False)
    old = channel._line.channel

    class Fast:
        closed = False

        def close(self) -> None:
            self.closed = True

    fast = Fast()
    channel._fast = fast  # type: ignore[assignment]
    channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())
    assert channel._fast is None and fast.closed and channel._fast_relearn_at == 0.0
    assert not old.closed  # calls may still be in flight on it
    channel.close()
    assert old.closed and channel._line.channel.closed


class FakeFastLine:
    """A fast line whose every call gets the given (code, body)."""

    def __init__(self, code: int, body: bytes) -> None:
        self.code, self.body = code, body
        self.address = ("s", 1)
        self.closed = False

    def call(self, method_id: int, body: bytes, timeout_s: float,
             abandon: Any = None, spin: bool = False, meanwhile: Any = None) -> tuple[int, bytes]:
        if meanwhile is not None:
            meanwhile()
        return self.code, self.body

    def close(self) -> None:
        self.closed = True


def test_a_redirect_over_the_fast_line_moves_the_call_to_the_leader(masters, monkeypatch):
    masters["s:1"] = FakeMaster("s:1", "standby", leader="l:1")
    masters["l:1"] = FakeMaster("l:1", fast_port=7000)
    learned: list[tuple[str, int]] = []

    class LearnedFast(FakeFastLine):
        def __init__(self, host: str, port: int, tls_ca: str | None = None,
                     spin: Any = None) -> None:
            super().__init__(0, pb.PutStartReply(header=pb.ReplyHeader(epoch=10)).SerializeToString())
            learned.append((host, port))

    monkeypatch.setattr(rpc, "_FastLine", LearnedFast)
    channel = rpc.MasterChannel("s:1")
    details = redirect_details("m-s", "standby", "l:1", 10).encode()
    standby_fast = FakeFastLine(14, details)
    channel._fast = standby_fast  # type: ignore[assignment]
    reply = channel.call("PutStart", pb.PutStartRequest(), soon())
    assert reply.header.epoch == 10
    assert standby_fast.closed and channel.address == "l:1"
    assert masters["l:1"].calls == ["PutStart"]       # gRPC carried the redirected call
    # The next fast call learns the new leader's fast line from its ClusterStatus.
    channel.call("PutStart", pb.PutStartRequest(), soon())
    assert learned == [("l", 7000)]
    assert masters["l:1"].calls == ["PutStart", "ClusterStatus"]


def test_fast_line_unavailable_without_a_leader_falls_back_to_grpc(masters):
    masters["l:1"] = FakeMaster("l:1")
    channel = rpc.MasterChannel("l:1")
    fast = FakeFastLine(14, b"the master is rebuilding its table; retry shortly")
    channel._fast = fast  # type: ignore[assignment]
    channel.call("GetReplicas", pb.GetReplicasRequest(), soon())
    assert channel._fast is fast and not fast.closed and channel.switches == 0
    assert masters["l:1"].calls == ["GetReplicas"]


def test_a_fast_reply_from_an_older_epoch_is_refused(masters):
    masters["l:1"] = FakeMaster("l:1", epoch=10)
    channel = rpc.MasterChannel("l:1")
    channel._fence.check(20, "elsewhere")
    channel._fast = FakeFastLine(  # type: ignore[assignment]
        0, pb.PutEndReply(header=pb.ReplyHeader(epoch=10)).SerializeToString())
    with pytest.raises(cellar.Unavailable, match="older than 20"):
        channel.call("PutEnd", pb.PutEndRequest(), soon())


# ---- addresses -------------------------------------------------------------------------------

@pytest.mark.parametrize("address", [
    "etcd://", "etcd://127.0.0.1:2379", "etcd://127.0.0.1:2379/", "etcd://nohost/c1",
    "etcd://127.0.0.1:2379/bad name", "localhost", "http://127.0.0.1:1", "",
])
def test_bad_addresses_are_invalid_arguments(address):
    with pytest.raises(cellar.InvalidArgument):
        cellar.connect(address, timeout_s=0.5)


def test_parse_master_address():
    assert sync.parse_master_address("127.0.0.1:50051") is None
    target = sync.parse_master_address("etcd://127.0.0.1:2379,127.0.0.1:2380/c1")
    assert target is not None and target.cluster == "c1" and len(target.endpoints) == 2


def test_an_unreachable_etcd_is_unavailable_within_the_timeout(record_property):
    """The outcome is Unavailable, not a hang (the test's own timeout guards that)."""
    port = free_port()  # nobody listens there
    started = time.monotonic()
    with pytest.raises(cellar.Unavailable):
        cellar.connect(f"etcd://127.0.0.1:{port}/c1", timeout_s=0.5)
    record_property("unavailable_after_s", round(time.monotonic() - started, 3))


def test_probe_master_takes_one_master_address():
    with pytest.raises(cellar.InvalidArgument):
        probe.probe_master("etcd://127.0.0.1:2379/c1")


# ---- cellar status ---------------------------------------------------------------------------

def test_status_shows_role_epoch_leader_and_the_masters():
    from cellar.client import cli

    masters = [
        {"master_id": "m-0", "address": "127.0.0.1:5001", "http": "127.0.0.1:8001",
         "role": "leader", "epoch": 1700000000123, "lease_remaining_s": 2.5,
         "takeover": {"duration_s": 0.42, "recovered_objects": 1000, "complete": True}},
        {"master_id": "m-1", "address": "127.0.0.1:5002", "http": "", "role": "standby",
         "epoch": 0, "lease_remaining_s": None, "takeover": None},
    ]
    table = cli.render_masters("c1", masters)
    lines = table.splitlines()
    assert lines[0].split() == ["MASTER", "ADDRESS", "HTTP", "ROLE", "EPOCH", "LEASE", "TAKEOVER"]
    assert "leader" in lines[1] and "2.5s" in lines[1] and "0.42s, 1000 objects" in lines[1]
    assert lines[2].split()[:4] == ["m-1", "127.0.0.1:5002", "-", "standby"]
    assert lines[1].index("127.0.0.1:5001") == lines[0].index("ADDRESS")  # addresses align left
    assert "no masters registered" in cli.render_masters("c1", [])
    line = cli.render_master_line({"address": "127.0.0.1:5002", "role": "standby",
                                   "epoch": 7, "leader_address": "127.0.0.1:5001"})
    assert line == "master 127.0.0.1:5002: role standby  epoch 7  leader 127.0.0.1:5001"
    status = {"role": "leader", "leader_address": "", "epoch": 7, "capacity_bytes": 0,
              "used_bytes": 0, "object_count": 0, "max_object_bytes": 0, "nodes": [],
              "tenants": []}
    head = cli.render_status("127.0.0.1:5001", status).splitlines()[0]
    assert head == "Cellar master 127.0.0.1:5001  role leader  epoch 7  leader 127.0.0.1:5001"


def test_status_against_an_unreachable_etcd_is_one_line(capsys):
    from cellar.client import cli

    port = free_port()  # nobody listens there
    assert cli.status_main(["--master", f"etcd://127.0.0.1:{port}/c1", "--timeout", "300ms"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("cellar status: Unavailable:") and "\n" not in err
    assert cli.status_main(["--master", "etcd://127.0.0.1:1"]) == 1
    assert "InvalidArgument" in capsys.readouterr().err


def test_a_put_the_new_leader_adopted_from_the_nodes_is_reported_as_ours():
    """After a failover, a re-placed put may find its own bytes already adopted from a node's
    index: same size and checksum means OK; anything else stays ALREADY_EXISTS."""
    from cellar.client import flows
    from cellar.client.puts import PutEntry
    from cellar.errors import Status
    from cellar.proto import cellar_pb2 as pb

    released: list[int] = []
    asked: list[list[str]] = []

    class Master:
        def call(self, method, request, deadline):
            asked.append(list(request.keys))
            return pb.GetReplicasReply(results=[
                pb.GetResult(size_bytes=3, checksum=7, pin_id=9),
                pb.GetResult(size_bytes=3, checksum=8, pin_id=10),
                pb.GetResult(status=pb.NOT_FOUND),
            ])

    session = flows.Session("default", pb.RequestHeader(tenant="default", client_id="c"), 5.0,
                            None, None, released.extend)  # type: ignore[arg-type]
    entries = [PutEntry(k, memoryview(b"abc"), 7, status=Status.ALREADY_EXISTS) for k in "abc"]
    entries.append(PutEntry("d", memoryview(b"abc"), 7, status=Status.OK))
    flow = flows.settle_own_writes(session, entries, soon())
    effect = next(flow)
    with pytest.raises(StopIteration):
        flow.send(Master().call(effect.method, effect.request, effect.deadline))
    assert asked == [["a", "b", "c"]]
    assert [e.status for e in entries] == [Status.OK, Status.ALREADY_EXISTS,
                                           Status.ALREADY_EXISTS, Status.OK]
    assert released == [9, 10]


def test_with_etcd_a_frozen_leader_is_abandoned_for_the_one_etcd_names(masters, monkeypatch,
                                                                        record_property):
    """A leader frozen (SIGSTOP) or cut off answers nothing and refuses nothing: the call asks
    etcd every LEADER_CHECK_AFTER_S and moves on as soon as another master leads, not at the
    caller's own deadline (were it waited for, the frozen master would end the call with
    DEADLINE_EXCEEDED and b:1 would never be asked)."""
    monkeypatch.setattr(rpc, "LEADER_CHECK_AFTER_S", 0.05)
    masters["a:1"] = FakeMaster("a:1", "frozen", epoch=10)
    masters["b:1"] = FakeMaster("b:1", epoch=30)
    asked: list[str] = []

    def resolve(_timeout_s: float) -> str:
        asked.append("a:1" if len(asked) < 2 else "b:1")  # elected at the third lookup
        return asked[-1]

    channel = rpc.MasterChannel("a:1", fast=False, resolve=resolve)
    started = time.monotonic()
    reply = channel.call("Remove", pb.KeysRequest(keys=["k"]), soon(20.0))
    record_property("moved_after_s", round(time.monotonic() - started, 3))
    assert reply.header.epoch == 30 and channel.address == "b:1"
    assert asked == ["a:1", "a:1", "b:1"]           # moved at the first lookup naming b:1
    assert masters["b:1"].calls == ["Remove"] and "Remove" in masters["a:1"].calls


def test_with_etcd_a_slow_leader_that_still_leads_is_waited_for(masters, monkeypatch):
    """Etcd still names the slow master: the call keeps waiting on it (never sent twice)."""
    monkeypatch.setattr(rpc, "LEADER_CHECK_AFTER_S", 0.05)
    masters["a:1"] = FakeMaster("a:1", "frozen", epoch=10)
    asked: list[float] = []

    def resolve(_timeout_s: float) -> str:
        asked.append(time.monotonic())
        return "a:1"

    channel = rpc.MasterChannel("a:1", fast=False, resolve=resolve)
    with pytest.raises(cellar.CellarError):
        channel.call("Remove", pb.KeysRequest(keys=["k"]), soon(0.6))
    assert len(asked) >= 2 and channel.address == "a:1"
    assert masters["a:1"].calls.count("Remove") >= 1


def test_the_fast_line_gives_up_on_a_silent_master_when_asked_to(monkeypatch):
    """A real socket whose master never answers: the wait polls `abandon` and ends the call
    (as _FastLineDown, so gRPC carries it to the new leader) instead of sitting out 20 s."""
    import socket

    monkeypatch.setattr(rpc, "LEADER_CHECK_AFTER_S", 0.05)
    server = socket.create_server(("127.0.0.1", 0))
    try:
        line = rpc._FastLine("127.0.0.1", server.getsockname()[1])
        polls: list[int] = []

        def abandon() -> bool:
            polls.append(1)
            return len(polls) >= 3

        with pytest.raises(rpc._FastLineDown):
            line.call(4, b"", 20.0, abandon)
        assert len(polls) == 3  # ended by the third poll, not by the 20 s timeout
        with pytest.raises(TimeoutError):
            line.call(4, b"", 0.2, lambda: False)
        line.close()
    finally:
        server.close()


def test_the_fast_line_sets_a_socket_timeout_only_when_the_deadline_moves(monkeypatch):
    """Calls with about the same timeout keep the kernel timeout already set (a syscall per
    call saved); a deadline more than 1% shorter is always set, so no call waits past it."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    frame = rpc.FAST_FRAME

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            while head := conn.recv(frame.size, socket.MSG_WAITALL):
                length, _method = frame.unpack(head)
                body = conn.recv(length, socket.MSG_WAITALL) if length else b""
                conn.sendall(frame.pack(len(body), 0) + body)

    threading.Thread(target=answer, daemon=True).start()
    timeouts: list[float | None] = []
    real = socket.socket.settimeout
    monkeypatch.setattr(socket.socket, "settimeout",
                        lambda self, t: (timeouts.append(t), real(self, t))[1])
    line = rpc._FastLine("127.0.0.1", server.getsockname()[1])
    try:
        for timeout_s in (10.0, 9.995, 9.95, 10.5):
            assert line.call(4, b"ping", timeout_s) == (0, b"ping")
        assert timeouts[-1:] == [10.0] and timeouts.count(10.0) == 1  # set once, then kept
        assert line.call(4, b"x", 0.5) == (0, b"x")
        assert timeouts[-1] == 0.5          # a shorter deadline: set at once
        assert line.call(4, b"y", 5.0) == (0, b"y")
        assert timeouts[-1] == 5.0          # a much longer one too
    finally:
        line.close()
        server.close()


# ---- the asyncio face performs the same plans ------------------------------------------------

class FakeAioChannel:
    """Stands in for a grpc.aio channel to one fake master; its stub answers as FakeMaster."""

    def __init__(self, master: FakeMaster) -> None:
        self.master = master
        self.closed = False

    async def close(self, grace: Any = None) -> None:
        self.closed = True


class FakeAioStub:
    def __init__(self, channel: FakeAioChannel) -> None:
        self.master = channel.master

    def __getattr__(self, method: str) -> Any:
        master = self.master

        def start(request: Any, timeout: float) -> Any:
            async def answer() -> Any:
                try:
                    return master.answer(method)
                except FakeRpcError as exc:
                    raise grpc.aio.AioRpcError(
                        exc.code(), grpc.aio.Metadata(),
                        grpc.aio.Metadata(*exc.trailing_metadata()), exc.details()) from None
            return answer()
        return start


@pytest.fixture
def aio_masters(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeMaster]:
    from cellar.client import aio_rpc

    table: dict[str, FakeMaster] = {}

    def channel(address: str, options: Any, aio: bool = False) -> tuple[FakeAioChannel, None]:
        return FakeAioChannel(table.setdefault(address, FakeMaster(address, "dead"))), None

    monkeypatch.setattr(aio_rpc, "master_channel", channel)
    monkeypatch.setattr(aio_rpc.cellar_pb2_grpc, "MasterStub", FakeAioStub)
    return table


def test_the_asyncio_face_follows_a_redirect_and_bounds_its_retired_channels(aio_masters):
    import asyncio

    from cellar.client import aio_rpc

    async def body() -> None:
        n = rpc.MAX_RETIRED_CHANNELS + 2
        for i in range(n):  # m0 -> m1 -> ... each a standby naming the next
            aio_masters[f"m{i}:1"] = FakeMaster(f"m{i}:1", "standby", leader=f"m{i + 1}:1")
        aio_masters[f"m{n}:1"] = FakeMaster(f"m{n}:1", epoch=40)
        channel = aio_rpc.AsyncMasterChannel("m0:1")
        first = channel._channel
        reply = await channel.call("Remove", pb.KeysRequest(keys=["k"]), soon(5.0))
        assert reply.header.epoch == 40 and channel.address == f"m{n}:1"
        assert channel.generation == n and channel._fence.highest == 40
        assert len(channel._retired) == rpc.MAX_RETIRED_CHANNELS
        await asyncio.sleep(0)  # the overflow's close runs on the loop
        assert first.closed and not channel._retired[-1].closed
        retired, current = list(channel._retired), channel._channel
        await channel.aclose()
        assert all(c.closed for c in retired) and current.closed

    asyncio.run(body())


def test_the_asyncio_face_raises_the_fence_without_etcd(aio_masters):
    import asyncio

    from cellar.client import aio_rpc

    async def body() -> None:
        aio_masters["l:1"] = FakeMaster("l:1", epoch=10)
        channel = aio_rpc.AsyncMasterChannel("l:1")
        channel._fence.check(20, "elsewhere")
        with pytest.raises(cellar.Unavailable, match="older than 20"):
            await channel.call("Remove", pb.KeysRequest(keys=["k"]), soon())
        await channel.aclose()

    asyncio.run(body())
