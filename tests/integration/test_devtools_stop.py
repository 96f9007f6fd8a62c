"""`cellar.devtools.children.send_signal`: a SIGSTOP returns only once the process is frozen.

The kernel stops a many-threaded process in two steps (one thread is woken, it then marks the
others), so right after `kill()` other threads may still run. Tests that freeze a node and
then send it a request (test_sdk_deadline.py) need it frozen before the request goes. Here a
child runs busy threads that count in shared memory: once `send_signal(SIGSTOP)` returns, the
count must not move; after SIGCONT it moves again.
"""

from __future__ import annotations

import mmap
import signal
import subprocess
import sys
import time

from cellar.devtools.children import running_threads, send_signal

THREADS = 6
CHILD = f"""
import mmap, sys, threading
path = sys.argv[1]
f = open(path, "r+b")
shared = mmap.mmap(f.fileno(), 8 * {THREADS})
def spin(slot):
    n = 0
    while True:
        n += 1
        shared[8 * slot:8 * slot + 8] = n.to_bytes(8, "little")
for slot in range({THREADS}):
    threading.Thread(target=spin, args=(slot,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


def counts(shared: mmap.mmap) -> list[int]:
    return [int.from_bytes(shared[8 * i:8 * i + 8], "little") for i in range(THREADS)]


def test_a_sigstop_returns_once_every_thread_has_stopped(tmp_path) -> None:
    path = tmp_path / "counts"
    path.write_bytes(bytes(8 * THREADS))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 8 * THREADS) as shared:
            for _ in range(20):
                send_signal(proc, signal.SIGSTOP)
                assert running_threads(proc.pid) == []
                frozen = counts(shared)
                time.sleep(0.02)
                assert counts(shared) == frozen, "a thread ran after SIGSTOP returned"
                send_signal(proc, signal.SIGCONT)
                deadline = time.monotonic() + 10
                while counts(shared) == frozen:
                    assert time.monotonic() < deadline, "the child did not resume"
                    time.sleep(0.001)
    finally:
        proc.kill()
        proc.wait()
