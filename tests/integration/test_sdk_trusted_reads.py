"""Trusted reads against a real cluster (client/gets.py `start_trusted`,
master/state/read_trust.py), both faces, tcp and shm.

- A key read moments ago is read again without asking the master: the master's GetReplicas
  count does not move, the client's trusted count does, and the bytes are exact; the same for
  `get_into` and `get_into_ptr` (client/one_read.py: one read, no byte past the value's size
  written), while a buffer too small for the value asks and says BufferTooSmall.
- What keeps acknowledged changes true: another client's remove or upsert of a key this
  client read within the trust is acknowledged only once the trust has passed (it takes at
  least the rest of it), and this client's next get sees the change: a miss, or the new
  value. Never the old bytes. The same after an eviction and a new put of the key.
- A client's own remove or upsert of a key only it read does not wait, and it sees it.
- With $CELLAR_READ_BACK_KEYS, a key this client just put (alone, or in a batch of at most
  that many) is read without asking: its PutEnd brought back the read grants
  (client/read_backs.py); a larger batch's keys are asked for, as are a client's without it. Another client's change of a key just put waits for the
  writer's trust, and the writer then sees the change.
- A master restarted within the trust holds changes until a former master's trust has ended
  (over shm nothing else stops a reuse).
- Eight threads of one client putting, reading, replacing and reading again (the fast line's
  settling, taken per request): every read returns the thread's newest value.
- A trusted read the node refuses (the master restarted: the node refuses its former grants)
  is asked for as usual (`get` and `get_into`).
- A master with `read_trust_s = 0` grants no trust: every get asks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import cellar
from cellar.client import read_backs
from cellar.client.early_reads import Locations
from cellar.devtools.local_cluster import LocalCluster
from tests.support.faces import client_locations

SIZE = 64 << 10
TRUST_S = 1.0  # longer than the default, so a test's few calls fit well inside it


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "16MiB", master_flags={"allow_unknown_tenants": "true",
                                                "read_trust_s": TRUST_S}) as c:
        yield c


def locations(client: Any) -> Locations:
    found: Locations = client_locations(client)
    return found


OTHER_PROCESS = """
import sys, time
import cellar
address, tenant, token, transport, op, key, path = sys.argv[1:8]
value = open(path, "rb").read() if path != "-" else b""
with cellar.connect(address, tenant=tenant, token=token, transport=transport, timeout_s=30) as c:
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.monotonic()
    if op == "remove":
        c.remove(key)
    elif op == "upsert":
        c.upsert(key, value)
    elif op == "put":
        c.put(key, value)
    print(time.monotonic() - started, flush=True)
"""


class OtherProcess:
    """`op` of `key` by a client in another process (another client id: the master holds its
    change for this process's trust). The process starts and connects first, and waits; `run`
    then makes the call and returns the seconds it took there. So a slow interpreter start (a
    loaded machine) never eats into the trust a test times the call against."""

    def __init__(self, cluster: LocalCluster, tenant: str, transport: str, op: str, key: str,
                 value: bytes | None, tmp_path: Any) -> None:
        path = "-"
        if value is not None:
            path = str(tmp_path / f"value-{key.replace('/', '_')}")
            with open(path, "wb") as f:
                f.write(value)
        self._process = subprocess.Popen(
            [sys.executable, "-c", OTHER_PROCESS, cluster.address, tenant,
             cluster.token_for(tenant, shm=transport == "shm"), transport, op, key, path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        ready = self._process.stdout.readline().strip()
        if ready != "ready":
            self._process.kill()
            _, err = self._process.communicate(timeout=10)
            raise AssertionError(f"the other process did not connect: {err[-2000:]}")

    def run(self) -> float:
        out, err = self._process.communicate("go\n", timeout=60)
        assert self._process.returncode == 0, err[-2000:]
        return float(out.strip().splitlines()[-1])


def get_replicas_calls(cluster: LocalCluster) -> float:
    with urllib.request.urlopen(cluster.http_url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    match = re.search(r"^master_get_replica_list_requests_total (\S+)$", text, re.M)
    assert match, "the master exports its GetReplicas count"
    return float(match.group(1))


def test_a_key_read_moments_ago_is_read_again_without_asking(tenant_client: Any,
                                                              cluster: LocalCluster) -> None:
    client = tenant_client("trust-a")
    values = {f"a{i}": os.urandom(SIZE) for i in range(4)}
    assert client.put_many(list(values.items())) == [cellar.Status.OK] * 4
    assert client.get_many(list(values)) == list(values.values())  # asks, and is trusted
    seen = locations(client)
    trusted, asked = seen.trusted, get_replicas_calls(cluster)
    for key, value in values.items():
        assert client.get(key) == value
    assert client.get_many(list(values)) == list(values.values())
    assert seen.trusted - trusted == 4 + 4
    assert get_replicas_calls(cluster) == asked  # the master was not asked
    client.remove_prefix("a")


def test_get_into_and_get_into_ptr_read_a_key_read_moments_ago_in_one_read(
        tenant_client: Any, cluster: LocalCluster) -> None:
    """The zero-copy one-key gets (client/one_read.py): no GetReplicas, the bytes exact, no
    byte past the value's size written, each counted as a trusted read."""
    client = tenant_client("trust-into")
    values = {f"i{i}": os.urandom(SIZE - 1000 * i) for i in range(3)}
    assert client.put_many(list(values.items())) == [cellar.Status.OK] * 3
    assert client.get_many(list(values)) == list(values.values())  # asks, and is trusted
    seen = locations(client)
    trusted, asked = seen.trusted, get_replicas_calls(cluster)
    memory = cellar.alloc_buffer(SIZE + 4096)
    client.register_buffer(memory_address(memory), len(memory))
    for key, value in values.items():
        memory[:] = b"\xee" * len(memory)
        assert client.get_into(key, memory) == len(value)
        assert bytes(memory[:len(value)]) == value and memory[len(value)] == 0xEE
        memory[:] = b"\xee" * len(memory)
        assert client.get_into_ptr(key, memory_address(memory), len(memory)) == len(value)
        assert bytes(memory[:len(value)]) == value and memory[len(value)] == 0xEE
    with pytest.raises(cellar.BufferTooSmall):  # the general flow says so, after asking
        client.get_into("i0", memory[:100])
    assert seen.trusted - trusted == 6
    assert get_replicas_calls(cluster) == asked + 1  # only the one that did not fit asked
    client.unregister_buffer(memory_address(memory))
    client.remove_prefix("i")


def memory_address(view: memoryview) -> int:
    import ctypes
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


@pytest.mark.parametrize("op", ["remove", "upsert"])
def test_another_processs_change_is_acknowledged_after_the_trust_and_then_seen(
        op: str, tenant_client: Any, cluster: LocalCluster, tmp_path: Any) -> None:
    tenant = f"trust-{op}"
    reader = tenant_client(tenant)
    old, new = os.urandom(SIZE), os.urandom(SIZE // 2)
    reader.put("b", old)
    other = OtherProcess(cluster, tenant, "tcp", op, "b", new if op == "upsert" else None,
                         tmp_path)
    asked = time.monotonic()
    assert reader.get("b") == old  # trusted until about `asked` + TRUST_S
    waited_then_seen(other, asked, op, reader, "b", new)


def waited_then_seen(other: OtherProcess, trusted_from: float, op: str, reader: Any, key: str,
                     new: bytes) -> None:
    """`other` changes `key`: its call waits out `reader`'s trust (from `trusted_from`), and
    `reader` then sees the change."""
    took = other.run()
    assert time.monotonic() - trusted_from >= TRUST_S - 0.05, f"a {op} of a trusted key waits"
    assert took >= TRUST_S / 2
    if op == "remove":
        with pytest.raises(cellar.NotFound):
            reader.get(key)
    else:
        assert reader.get(key) == new
        reader.remove(key)


def test_a_clients_own_changes_do_not_wait_and_are_seen_by_it(tenant_client: Any) -> None:
    """The only reader of a key removes or replaces it: nothing waits (it forgot the key's
    place first), and its next get asks and sees the change."""
    client = tenant_client("trust-own")
    value = os.urandom(SIZE)
    client.put("own", value)
    assert client.get("own") == value
    started = time.monotonic()
    client.remove("own")
    with pytest.raises(cellar.NotFound):
        client.get("own")
    newer = os.urandom(SIZE)
    client.put("own", newer)
    assert client.get("own") == newer
    newest = os.urandom(SIZE // 2)
    client.upsert("own", newest)
    assert client.get("own") == newest
    assert time.monotonic() - started < TRUST_S / 2, "its own changes waited for the trust"
    client.remove("own")


def test_a_put_after_an_eviction_is_acknowledged_after_the_trust(
        tenant_client: Any, cluster: LocalCluster, tmp_path: Any) -> None:
    """The version read lately left by eviction (no change acknowledged then); the next put of
    the key, by another process, is the change, and it waits for the trust of the evicted
    version."""
    reader = tenant_client("trust-d")
    old = os.urandom(SIZE)
    reader.put("d", old)
    reader.put("d-next", old)
    new = os.urandom(SIZE)
    other = OtherProcess(cluster, "trust-d", "tcp", "put", "d", new, tmp_path)
    asked = time.monotonic()
    assert reader.get("d") == old
    assert reader.get("d-next") == old  # asks, and so releases the pin its get of "d" took
    filler = os.urandom(1 << 20)  # fill the 16 MiB node until "d" is evicted
    for i in range(40):
        reader.put(f"d-fill/{i}", filler)
        if not reader.exists("d"):
            break
    assert not reader.exists("d"), "the fill evicts the key"
    filled = time.monotonic() - asked
    assert filled < TRUST_S - 0.2, f"the fill took {filled:.3f} s: longer than the trust"
    took = other.run()
    assert time.monotonic() - asked >= TRUST_S - 0.05
    assert took >= 0.1, "the put waited inside the call (at least 0.2 s of the trust was left)"
    assert reader.get("d") == new
    reader.remove_prefix("d")


READ_BACK_KEYS = 8


@pytest.mark.parametrize("how", ["put", "put_many"])
def test_a_key_this_client_just_put_is_read_without_asking(
        how: str, tenant_client: Any, cluster: LocalCluster,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With $CELLAR_READ_BACK_KEYS a PutEnd of at most that many keys brings back their read
    grants (client/read_backs.py): the first get of each is one read, no GetReplicas; a
    larger batch's keys are asked for, and so are a client's without the setting."""
    plain = tenant_client(f"trust-put-{how}")
    monkeypatch.setenv(read_backs.READ_BACK_ENV, str(READ_BACK_KEYS))
    client = tenant_client(f"trust-put-{how}")
    client.put("w0", os.urandom(SIZE))  # the size repeats: single puts take the one-step path
    client.put("w1", os.urandom(SIZE))
    values = {f"p{i}": os.urandom(SIZE) for i in range(4)}
    if how == "put":
        for key, value in values.items():
            client.put(key, value)
    else:
        assert client.put_many(list(values.items())) == [cellar.Status.OK] * 4
    seen = locations(client)
    trusted, asked = seen.trusted, get_replicas_calls(cluster)
    for key, value in values.items():
        assert client.get(key) == value
    assert (seen.trusted - trusted, get_replicas_calls(cluster) - asked) == (4, 0)
    many = {f"m{i}": os.urandom(4096) for i in range(READ_BACK_KEYS + 1)}
    assert client.put_many(list(many.items())) == [cellar.Status.OK] * len(many)
    trusted, asked = seen.trusted, get_replicas_calls(cluster)
    assert client.get_many(list(many)) == list(many.values())
    assert (seen.trusted - trusted, get_replicas_calls(cluster) - asked) == (0, 1)
    plain.put("w2", os.urandom(SIZE))
    plain.put("p-plain", values["p0"])  # the one-step path, had it read back
    trusted, asked = locations(plain).trusted, get_replicas_calls(cluster)
    assert plain.get("p-plain") == values["p0"]
    assert (locations(plain).trusted - trusted, get_replicas_calls(cluster) - asked) == (0, 1)
    for prefix in ("w", "p", "m"):
        client.remove_prefix(prefix)


@pytest.mark.parametrize("op", ["remove", "upsert"])
def test_another_processs_change_of_a_key_just_put_waits_for_the_writers_trust(
        op: str, tenant_client: Any, cluster: LocalCluster, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer holds the read grants its PutEnd brought back: another client's change of
    the key is acknowledged only after the writer's trust, and the writer then sees it."""
    tenant = f"trust-put-{op}"
    monkeypatch.setenv(read_backs.READ_BACK_ENV, "1")
    writer = tenant_client(tenant)
    old, new = os.urandom(SIZE), os.urandom(SIZE // 2)
    other = OtherProcess(cluster, tenant, "tcp", op, "q", new if op == "upsert" else None,
                         tmp_path)
    sent = time.monotonic()
    writer.put("q", old)  # trusted until about `sent` + TRUST_S, no get needed
    waited_then_seen(other, sent, op, writer, "q", new)


def test_eight_threads_read_their_newest_values(tenant_client: Any) -> None:
    client = tenant_client("trust-e")
    stale: list[str] = []

    def worker(t: int) -> None:
        for r in range(4):
            key = f"e/{t}/{r}"
            first = os.urandom(4096)
            client.put(key, first)
            if client.get(key) != first:
                stale.append(f"{key}: first")
            second = os.urandom(100)
            client.upsert(key, second)
            if client.get(key) != second:
                stale.append(f"{key}: after upsert")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert stale == []
    client.remove_prefix("e/")


@pytest.mark.parametrize("call", ["get", "get_into"])
def test_a_trusted_read_under_a_former_masters_grant_is_asked_for(call: str) -> None:
    """The master restarts (a new epoch) within the trust: its node mounts at the new master
    before it reports its objects, and from then refuses the former master's grants. The
    trusted read (tcp: through the node) fails and the key is asked for, at the new master.
    (Over shm the client copies from its own mapping, with no node in the way: what keeps a
    change true there is the new master's wait, the next test.)"""
    with LocalCluster(1, "16MiB", master_flags={"read_trust_s": 5}) as cluster, \
            cellar.connect(cluster.address, timeout_s=30.0, transport="tcp") as client:
        value = os.urandom(SIZE)
        client.put("f", value)
        assert client.get("f") == value
        asked = time.monotonic()
        _restart_master(cluster, client, "f")
        assert time.monotonic() - asked < 4.5, "the restart outlasted the trust"
        seen = locations(client)
        trusted, failed = seen.trusted, seen.untrusted
        if call == "get":
            assert client.get("f") == value
        else:
            into = bytearray(SIZE)
            assert client.get_into("f", into) == SIZE and bytes(into) == value
        assert (seen.trusted, seen.untrusted) == (trusted, failed + 1)


@pytest.mark.parametrize("call", ["get", "get_into"])
def test_a_trusted_read_of_a_frozen_node_ends_by_the_calls_timeout(call: str) -> None:
    """The one-step read of a trusted key (client/one_read.py) waits on a frozen node for its
    share of the call's timeout; the general get that follows keeps what is left of the call's
    deadline, so the call ends by its `timeout_s` (not one and a half of it)."""
    timeout_s = 3.0
    with LocalCluster(1, "16MiB", master_flags={"read_trust_s": 5}) as cluster, \
            cellar.connect(cluster.address, timeout_s=30.0) as writer, \
            cellar.connect(cluster.address, timeout_s=timeout_s, transport="tcp") as client:
        value = os.urandom(SIZE)
        writer.put("h", value)  # a new master holds puts for its first read trust (5 s)
        assert client.get("h") == value  # asks: trusted from now on
        seen = locations(client)
        failed = seen.untrusted
        cluster.signal_node(0, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(cellar.CellarError):
                if call == "get":
                    client.get("h")
                else:
                    client.get_into("h", bytearray(SIZE))
            took = time.monotonic() - started
        finally:
            cluster.signal_node(0, signal.SIGCONT)
        assert seen.untrusted == failed + 1  # the one-step read was made, and failed
        assert took < timeout_s + 1.0, f"the call took {took:.2f} s with a {timeout_s} s timeout"


def test_a_restarted_master_holds_changes_until_a_former_masters_trust_has_ended(
        tmp_path: Any) -> None:
    """Over shm a trusted read copies from the client's own mapping, with no node to refuse
    the former master's grant; the new master knows nothing of what was read. So a remove at
    the new master within the trust waits until a former master's trust has ended, and the
    reader's next get misses."""
    with LocalCluster(1, "16MiB", master_flags={"read_trust_s": 4,
                                                "allow_unknown_tenants": "true"}) as cluster, \
            cellar.connect(cluster.address, timeout_s=30.0, transport="shm", tenant="g",
                           token=cluster.token_for("g", shm=True)) as reader:
        value = os.urandom(SIZE)
        reader.put("g", value)
        assert reader.get("g") == value
        asked = time.monotonic()
        _restart_master(cluster, reader, "g")
        assert time.monotonic() - asked < 3.5, "the restart outlasted the trust"
        OtherProcess(cluster, "g", "shm", "remove", "g", None, tmp_path).run()
        assert time.monotonic() - asked >= 4 - 0.05  # held to the end of the reader's trust
        with pytest.raises(cellar.NotFound):
            reader.get("g")


def _restart_master(cluster: LocalCluster, client: Any, key: str) -> None:
    """Restart the master; return once it serves `key` again (its node mounted and reported)."""
    cluster.restart_master()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if client.exists(key):
                return
        except cellar.CellarError:  # the new master is still rebuilding
            pass
        time.sleep(0.05)
    pytest.fail(f"the restarted master did not serve {key!r} within 20 s")


def test_no_trust_from_a_master_that_grants_none() -> None:
    with LocalCluster(1, "16MiB", master_flags={"read_trust_s": 0}) as cluster, \
            cellar.connect(cluster.address) as client:
        client.put("k", b"v" * 100)
        assert client.get("k") == b"v" * 100
        asked = get_replicas_calls(cluster)
        assert client.get("k") == b"v" * 100
        assert get_replicas_calls(cluster) == asked + 1
        assert locations(client).trusted == 0
        started = time.monotonic()
        client.remove("k")
        assert time.monotonic() - started < 0.5  # nothing to wait for
