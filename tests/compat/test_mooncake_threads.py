"""One store used by 8 threads at once (as an engine's I/O threads do), started together by a
barrier: every thread's zero-copy and byte puts and gets return exactly its own bytes."""

from __future__ import annotations

import ctypes
import os
import threading

from cellar.compat.mooncake import ReplicateConfig

THREADS = 8
ROUNDS = 20
PAGE = 16 << 10


def test_eight_threads_share_one_store(new_store, buffers):
    store = new_store()
    barrier = threading.Barrier(THREADS)
    errors: list[str] = []
    region = buffers.make(THREADS * 2 * PAGE)
    base = buffers.ptr(region)
    assert store.register_buffer(base, THREADS * 2 * PAGE) == 0

    def worker(t: int) -> None:
        src, dst = base + 2 * t * PAGE, base + (2 * t + 1) * PAGE
        cfg = ReplicateConfig()
        barrier.wait()
        for r in range(ROUNDS):
            data = os.urandom(PAGE)
            ctypes.memmove(src, data, PAGE)
            key = f"thr/{t}/{r}"
            if store.put_from(key, src, PAGE, cfg) != 0:
                errors.append(f"put_from {key}")
            if store.get_into(key, dst, PAGE) != PAGE or ctypes.string_at(dst, PAGE) != data:
                errors.append(f"get_into {key}")
            if store.get(key) != data or store.is_exist(key) != 1:
                errors.append(f"get {key}")
            small = data[:100]
            if store.upsert(key, small) != 0 or store.get(key) != small:
                errors.append(f"upsert {key}")
            got = store.batch_get_into([key, f"thr/{t}/none"], [dst, dst], [PAGE, PAGE])
            if got != [100, -704] or ctypes.string_at(dst, 100) != small:
                errors.append(f"batch_get_into {key}: {got}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
