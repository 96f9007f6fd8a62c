"""`list_keys()` and `list_all_keys()` on both faces, against a real cluster that authenticates
every call (a master of max_list_keys = 20, so a page over the limit is cheap to ask for).

- a page is the caller's keys that exist, ascending in str order, filtered by prefix, strictly
  after start_after, at most limit long; walking pages lists every key exactly once;
- a put in flight (PutStart without PutEnd) and a removed key are not listed; another
  tenant's keys are invisible;
- `more` on the wire says whether further keys match (a raw ListKeys call);
- limit 0, a limit over the cluster's max, a non-str prefix or start_after: InvalidArgument
  before anything is sent (the client learned the max from ClusterStatus); the master refuses
  the same itself (INVALID_ARGUMENT); nothing changes either way;
- list_all_keys pages through everything (page_keys bounded like limit).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from tests.support.faces import FACES, connect_face

MAX_LIST_KEYS = 20


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "64MiB", master_flags={"allow_unknown_tenants": "true",
                                                 "max_list_keys": MAX_LIST_KEYS}) as c:
        yield c


@pytest.fixture(params=FACES)
def connect(request: pytest.FixtureRequest, cluster: LocalCluster) -> Iterator[Any]:
    """connect(tenant) over the face under test with a new token of that tenant; every client
    is closed at teardown."""
    opened: list[Any] = []

    def open_client(tenant: str) -> Any:
        client = connect_face(request.param, cluster.address, tenant=tenant,
                              token=cluster.token_for(tenant, shm=True), transport="tcp",
                              timeout_s=30.0)
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        client.close()


@pytest.fixture
def stub(cluster: LocalCluster) -> Iterator[pb_grpc.MasterStub]:
    with grpc.insecure_channel(cluster.address) as channel:
        yield pb_grpc.MasterStub(channel)


_SEQ = itertools.count()


def tenant_of(request: pytest.FixtureRequest, tag: str) -> str:
    """A tenant of its own for each test case (names: letters, digits, . _ -)."""
    return f"lk-{tag}-{request.node.callspec.params['connect']}-{next(_SEQ)}"


def test_pages_are_ordered_filtered_and_cover_every_key_once(
        connect: Any, request: pytest.FixtureRequest) -> None:
    me = connect(tenant_of(request, "order"))
    keys = [f"a/{i}" for i in range(25)] + ["b/1", "b/0", "a", "é/1", "Z"]
    me.put_many([(k, k.encode()) for k in reversed(keys)])
    everything = sorted(keys)
    assert everything[:3] == ["Z", "a", "a/0"] and everything[-1] == "é/1"  # str order

    assert me.list_keys(limit=MAX_LIST_KEYS) == everything[:MAX_LIST_KEYS]
    assert me.list_keys("b/", limit=5) == ["b/0", "b/1"]
    with pytest.raises(cellar.InvalidArgument, match=f"between 1 and {MAX_LIST_KEYS}, got 1000"):
        me.list_keys()  # the default page of 1000 is over this cluster's max_list_keys
    assert me.list_keys("a/", start_after="a/2", limit=3) == ["a/20", "a/21", "a/22"]
    assert me.list_keys("nothing/", limit=5) == []
    assert me.list_keys(start_after="é/1", limit=5) == []

    for limit in (1, 7, MAX_LIST_KEYS):
        seen: list[str] = []
        start_after = ""
        while True:
            page = me.list_keys("a/", start_after=start_after, limit=limit)
            assert len(page) <= limit
            seen += page
            if len(page) < limit:
                break
            start_after = page[-1]
        assert seen == sorted(k for k in keys if k.startswith("a/")), limit
    assert me.list_all_keys(page_keys=4) == everything
    # page_keys over the cluster's max asks pages of the max (the default 1000 works anywhere)
    assert me.list_all_keys("a/") == sorted(k for k in keys if k.startswith("a/"))


def test_in_flight_removed_and_foreign_keys_are_not_listed(
        cluster: LocalCluster, connect: Any, stub: pb_grpc.MasterStub,
        request: pytest.FixtureRequest) -> None:
    mine, theirs = tenant_of(request, "mine"), tenant_of(request, "theirs")
    me, them = connect(mine), connect(theirs)
    me.put_many([("k/0", b"0"), ("k/1", b"1"), ("k/gone", b"x")])
    them.put_many([("k/2", b"t"), ("k/theirs", b"t")])
    assert me.remove("k/gone")
    header = pb.RequestHeader(tenant=mine, token=cluster.token_for(mine))
    started = stub.PutStart(pb.PutStartRequest(header=header, items=[
        pb.PutItem(key="k/writing", size_bytes=64)]))
    assert started.results[0].status == pb.OK
    try:
        assert me.list_keys("k/", limit=5) == ["k/0", "k/1"]
        assert me.list_all_keys() == ["k/0", "k/1"]
        assert them.list_keys(limit=5) == ["k/2", "k/theirs"]
    finally:
        stub.PutRevoke(pb.PutRevokeRequest(header=header, items=[
            pb.PutRef(key="k/writing", put_id=started.results[0].put_id)]))
    me.put("k/writing", b"w")  # once complete, it is listed
    assert me.list_keys("k/", limit=5) == ["k/0", "k/1", "k/writing"]
    # an admin token names the tenant it lists; a tenant token cannot name another one
    admin = pb.RequestHeader(tenant=theirs, token=cluster.admin_token)
    assert list(stub.ListKeys(pb.ListKeysRequest(header=admin, limit=5)).keys) == ["k/2", "k/theirs"]
    claim = pb.RequestHeader(tenant=theirs, token=cluster.token_for(mine))
    with pytest.raises(grpc.RpcError) as info:
        stub.ListKeys(pb.ListKeysRequest(header=claim, limit=5))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_more_says_whether_further_keys_match(cluster: LocalCluster, connect: Any,
                                              stub: pb_grpc.MasterStub,
                                              request: pytest.FixtureRequest) -> None:
    tenant = tenant_of(request, "more")
    connect(tenant).put_many([(f"m/{i}", b"v") for i in range(5)])
    header = pb.RequestHeader(tenant=tenant, token=cluster.token_for(tenant))

    def page(start_after: str, limit: int) -> tuple[list[str], bool]:
        reply = stub.ListKeys(pb.ListKeysRequest(header=header, prefix="m/",
                                                 start_after=start_after, limit=limit))
        return list(reply.keys), reply.more

    assert page("", 4) == (["m/0", "m/1", "m/2", "m/3"], True)
    assert page("m/3", 4) == (["m/4"], False)
    assert page("", 5) == ([f"m/{i}" for i in range(5)], False)  # exactly the rest: no more
    assert page("m/4", 1) == ([], False)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"limit": 0}, "limit"),
    ({"limit": MAX_LIST_KEYS + 1}, f"between 1 and {MAX_LIST_KEYS}"),  # learned from the master
    ({"limit": -1}, "limit"),
    ({"limit": "5"}, "limit must be an int"),
    ({"prefix": 7}, "prefix must be a str"),
    ({"prefix": b"k/"}, "prefix must be a str"),
    ({"start_after": None}, "start_after must be a str"),
    ({"prefix": "p" * 1025}, "prefix is 1025 bytes"),
])
def test_bad_arguments_are_invalid_argument_and_change_nothing(
        connect: Any, request: pytest.FixtureRequest, kwargs: dict[str, Any], says: str) -> None:
    me = connect(tenant_of(request, "bad"))
    me.put_many([("k/0", b"0"), ("k/1", b"1")])
    with pytest.raises(cellar.InvalidArgument, match=says):
        me.list_keys(**kwargs)
    assert me.list_keys(limit=5) == ["k/0", "k/1"]
    assert me.get_many(["k/0", "k/1"]) == [b"0", b"1"]


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"page_keys": 0}, "page_keys"),
    ({"page_keys": True}, "page_keys must be an int"),
    ({"prefix": None}, "prefix must be a str"),
])
def test_bad_walk_arguments_are_invalid_argument(connect: Any, request: pytest.FixtureRequest,
                                                 kwargs: dict[str, Any], says: str) -> None:
    me = connect(tenant_of(request, "badwalk"))
    with pytest.raises(cellar.InvalidArgument, match=says):
        me.list_all_keys(**kwargs)


@pytest.mark.parametrize("limit", [0, MAX_LIST_KEYS + 1])
def test_the_master_refuses_a_bad_limit_itself(cluster: LocalCluster, stub: pb_grpc.MasterStub,
                                               limit: int) -> None:
    tenant = "lk-raw"
    header = pb.RequestHeader(tenant=tenant, token=cluster.token_for(tenant))
    with pytest.raises(grpc.RpcError) as info:
        stub.ListKeys(pb.ListKeysRequest(header=header, limit=limit))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_list_keys" in (info.value.details() or "")
    for what in ("prefix", "start_after"):
        with pytest.raises(grpc.RpcError) as info:
            stub.ListKeys(pb.ListKeysRequest(header=header, limit=1, **{what: "x" * 1025}))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert what in (info.value.details() or "")


def test_status_reports_the_page_limit(connect: Any, request: pytest.FixtureRequest) -> None:
    assert connect(tenant_of(request, "status")).status()["max_list_keys"] == MAX_LIST_KEYS
