"""`remove_all()` on both faces, against a real cluster that authenticates every call.

- it removes every key of the caller's tenant (the master's RemoveAll) and returns the count;
  another tenant's keys stay; a second call removes 0;
- naming another tenant takes an admin token: a tenant token gets PermissionDenied and
  nothing is removed; an admin removes exactly that tenant's keys;
- a tenant that is not a non-empty str is InvalidArgument before anything is sent; a closed
  client raises ClientClosed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster
from tests.support.faces import FACES, connect_face


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "64MiB", master_flags={"allow_unknown_tenants": "true"}) as c:
        yield c


@pytest.fixture(params=FACES)
def connect(request: pytest.FixtureRequest, cluster: LocalCluster) -> Iterator[Any]:
    """connect(tenant, token) over the face under test; every client is closed at teardown."""
    opened: list[Any] = []

    def open_client(tenant: str, token: str) -> Any:
        client = connect_face(request.param, cluster.address, tenant=tenant, token=token,
                              transport="tcp", timeout_s=30.0)
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        client.close()


def test_remove_all_takes_the_callers_tenant_only(cluster: LocalCluster, connect: Any,
                                                  request: pytest.FixtureRequest) -> None:
    face = request.node.callspec.id
    mine, theirs = f"ra-mine-{face}", f"ra-theirs-{face}"
    me = connect(mine, cluster.token_for(mine))
    them = connect(theirs, cluster.token_for(theirs))
    for i in range(5):
        me.put(f"k/{i}", b"m" * (i + 1))
    them.put_many([("k/0", b"t0"), ("k/1", b"t1")])

    assert me.remove_all() == 5
    assert me.exists_many([f"k/{i}" for i in range(5)]) == [False] * 5
    assert them.get_many(["k/0", "k/1"]) == [b"t0", b"t1"]
    assert me.remove_all() == 0


def test_naming_another_tenant_needs_an_admin(cluster: LocalCluster, connect: Any,
                                              request: pytest.FixtureRequest) -> None:
    face = request.node.callspec.id
    mine, theirs = f"rb-mine-{face}", f"rb-theirs-{face}"
    me = connect(mine, cluster.token_for(mine))
    them = connect(theirs, cluster.token_for(theirs))
    them.put_many([("a", b"1"), ("b", b"2"), ("c", b"3")])
    me.put("mine", b"x")

    with pytest.raises(cellar.PermissionDenied):
        me.remove_all(tenant=theirs)
    assert them.exists_many(["a", "b", "c"]) == [True] * 3

    admin = connect("default", cluster.admin_token)
    assert admin.remove_all(tenant=theirs) == 3
    assert them.exists_many(["a", "b", "c"]) == [False] * 3
    assert me.get("mine") == b"x"  # the admin named one tenant: the others stay
    assert me.remove_all(tenant=mine) == 1  # naming one's own tenant is allowed


@pytest.mark.parametrize("bad", ["", 7, b"bytes", "t" * 1000])
def test_bad_tenant_is_invalid_argument_and_sends_nothing(cluster: LocalCluster, connect: Any,
                                                          bad: Any) -> None:
    me = connect("rc", cluster.token_for("rc"))
    me.put("kept", b"v")
    with pytest.raises(cellar.InvalidArgument):
        me.remove_all(tenant=bad)
    assert me.get("kept") == b"v"
    me.remove_all()


def test_remove_all_on_a_closed_client(cluster: LocalCluster, connect: Any) -> None:
    me = connect("rd", cluster.token_for("rd"))
    if hasattr(me, "run"):  # the async face: close the client, keep the test's loop running
        me.run(me.client.aclose())
    else:
        me.close()
    with pytest.raises(cellar.ClientClosed):
        me.remove_all()
