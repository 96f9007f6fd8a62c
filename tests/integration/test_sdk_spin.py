"""The sync face's reply wait spins on the fast line and the tcp data plane of a real cluster
(transfer/spin_wait.py), and changes no result: the same calls with spinning off (0) agree.

What is asserted is where the client waited (windows spun and replies seen in them, counted
by the client's own SpinWait) and the values; never how long a call took (`make bench` and
`cellar bench --only sdk` measure that)."""

from __future__ import annotations

import os

import pytest

import cellar

KIB = 1 << 10


def _calls(client: cellar.Client, prefix: str) -> tuple[int, list[bool]]:
    values = {f"{prefix}/{i:03d}": os.urandom(64 * KIB) for i in range(40)}
    for key, value in values.items():
        client.put(key, value)
    got = [client.get(key) for key in values]
    assert got == list(values.values())
    run = client.lookup([*values, f"{prefix}/missing"]).prefix_len
    exists = client.exists_many([*values][:5] + [f"{prefix}/missing"])
    return run, exists


def test_spinning_waits_on_the_master_and_the_node_and_changes_no_result(
        module_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = module_cluster(nodes=1, segment_size="64MiB")
    # a 5 ms window: even a loaded machine's replies land in it, so the windows do not rest
    monkeypatch.setenv("CELLAR_SPIN_US", "5000")
    with cellar.connect(cluster.address, transport="tcp") as client:
        spin = client._master._spin
        assert spin is not None and spin.window_ns == 5_000_000
        tcp = [t for t in client._transports.transports if t.name == "tcp"]
        assert tcp and tcp[0].spin is spin  # one window and rest state per client
        spins_before = spin.spins
        run_on, exists_on = _calls(client, "spin-on")
        # 40 puts (PutStart, write, PutEnd), 40 gets (GetReplicas, read), a lookup, an
        # exists: ~200 waits, each a window of its own unless another thread spins
        assert spin.spins - spins_before >= 150 and spin.hits >= spin.spins // 2
        spins_before = spin.spins
        assert client.put_many({f"spin-on/many/{i}": b"v" * 4096 for i in range(16)}) \
            == [cellar.Status.OK] * 16
        assert spin.spins == spins_before  # a batch's replies are not due within microseconds
    monkeypatch.setenv("CELLAR_SPIN_US", "0")
    with cellar.connect(cluster.address, transport="tcp") as client:
        assert client._master._spin is None
        assert all(t.spin is None for t in client._transports.transports if t.name == "tcp")
        run_off, exists_off = _calls(client, "spin-off")
    assert (run_on, exists_on) == (run_off, exists_off) == (40, [True] * 5 + [False])


def test_a_bad_spin_setting_fails_connect_before_anything_opens(
        module_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = module_cluster(nodes=1, segment_size="64MiB")
    monkeypatch.setenv("CELLAR_SPIN_US", "lots")
    with pytest.raises(cellar.InvalidArgument, match="CELLAR_SPIN_US"):
        cellar.connect(cluster.address, transport="tcp")


def test_over_shm_a_lone_commit_is_spun_for_and_a_batchs_are_not(
        module_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A single put over shm copies the value itself and waits for one COMMIT's reply from
    the node (transfer/control.py): due within microseconds, so it is spun for, as tcp spins
    for a one-chunk transfer; a batch's COMMITs are not."""
    cluster = module_cluster(nodes=1, segment_size="64MiB")
    monkeypatch.setenv("CELLAR_SPIN_US", "5000")
    with cellar.connect(cluster.address, transport="shm") as client:
        spin = client._master._spin
        (shm,) = [t for t in client._transports.transports if t.name == "shm"]
        assert spin is not None and shm._control.spin is spin
        in_writes: list[int] = []
        real_write = shm.write

        def write(ops, timeout_s):  # type: ignore[no-untyped-def]
            before = spin.spins
            try:
                return real_write(ops, timeout_s)
            finally:
                in_writes.append(spin.spins - before)

        monkeypatch.setattr(shm, "write", write)
        values = {f"shm-spin/{i:02d}": os.urandom(64 * KIB) for i in range(12)}
        for key, value in values.items():
            client.put(key, value)
        assert in_writes == [1] * len(values)  # one window per put: its COMMIT's reply
        in_writes.clear()
        assert client.put_many({f"shm-spin/many/{i}": b"v" * 4096 for i in range(16)}) \
            == [cellar.Status.OK] * 16
        assert in_writes and set(in_writes) == {0}
        assert [client.get(key) for key in values] == list(values.values())
