"""One `Client` shared by 16 threads at once, as an engine uses it: prefetch-like threads doing
deadline-bounded `get_many_into` into their own buffers and backup-like threads doing
`put_many` (plain and upsert) of their own pages, all against shared keys too. Exact bytes,
no deadlock (every thread ends), and blocking calls release the GIL."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import cellar
from cellar.errors import Status

THREADS = 16
ROUNDS = 6
PAGE_BYTES = 48 << 10
PAGES = 16


@pytest.fixture(scope="module")
def cluster(module_cluster):
    return module_cluster(nodes=2, segment_size="256MiB")


def page(seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, PAGE_BYTES, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_16_threads_prefetch_and_backup_on_one_client(cluster, connect_to, transport):
    client = connect_to(cluster, transport=transport)
    shared = {f"th-{transport}/shared/{i}": page(i) for i in range(PAGES)}
    assert client.put_many(shared) == [Status.OK] * PAGES
    errors: list[BaseException] = []
    done = [0] * THREADS

    def prefetch(t: int) -> None:
        keys = list(shared)
        bufs = [bytearray(PAGE_BYTES) for _ in keys]
        for r in range(ROUNDS):
            order = keys[t % PAGES:] + keys[:t % PAGES]
            got = client.get_many_into(order + [f"th-{transport}/none/{t}"],
                                       [bufs[keys.index(k)] for k in order] + [bytearray(1)],
                                       timeout_s=20.0)
            assert got == [PAGE_BYTES] * PAGES + [cellar.MISS], (t, r, got)
            for k in order:
                assert bufs[keys.index(k)] == shared[k], (t, r, k)
            assert client.prefix_len(order) == PAGES

    def backup(t: int) -> None:
        for r in range(ROUNDS):
            mine = {f"th-{transport}/{t}/{r}/{i}": page(t * 10_000 + r * 100 + i)
                    for i in range(PAGES // 2)}
            assert client.put_many(mine) == [Status.OK] * len(mine)
            again = {k: v[::-1] for k, v in mine.items()}
            assert client.put_many(again, upsert=True) == [Status.OK] * len(again)
            assert client.get_many(list(again)) == list(again.values())
            assert client.exists_many(list(mine)) == [True] * len(mine)

    def run(t: int) -> None:
        try:
            (prefetch if t % 2 else backup)(t)
            done[t] = 1
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,), name=f"engine-{t}") for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not [th.name for th in threads if th.is_alive()], "a thread is stuck (deadlock?)"
    assert not errors, errors
    assert sum(done) == THREADS
    assert client.remove_prefix(f"th-{transport}/") == PAGES + (THREADS // 2) * ROUNDS * PAGES // 2


def test_a_large_get_releases_the_gil(cluster, connect_to):
    """With the interpreter's switch interval raised so far that a thread only gets the GIL
    when its holder gives it up, a CPU-bound Python thread still advances while one 96 MiB get
    runs: the get blocks with the GIL released (sockets, waits), not in Python code."""
    client = connect_to(cluster, transport="tcp")
    big = np.random.default_rng(5).integers(0, 256, 96 << 20, dtype=np.uint8)
    client.upsert("gil/big", big)
    dest = np.zeros_like(big)
    counter = [0]
    stop = threading.Event()
    started = threading.Event()

    def spin() -> None:
        started.set()
        while not stop.is_set():
            x = 0
            for i in range(200):  # pure-Python work: needs the GIL throughout
                x += i * i
            counter[0] += 1
            time.sleep(0)  # hand the GIL back, so the test does not wait out the interval

    old = sys.getswitchinterval()
    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    started.wait(5)
    sys.setswitchinterval(30.0)
    try:
        before = counter[0]
        assert client.get_into("gil/big", dest) == big.nbytes
        during = counter[0] - before
    finally:
        sys.setswitchinterval(old)
        stop.set()
        thread.join(5)
    assert np.array_equal(dest, big)
    assert during > 0, "the spinning thread never ran while the get was in progress"
    client.remove("gil/big")
