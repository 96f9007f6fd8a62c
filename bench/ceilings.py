"""This machine's own limits for a KV store's data path, measured in the bench's own run.

- tcp_GBps: loopback TCP between two processes, 4 MiB sendall / recv_into into one
  preallocated buffer: the most any TCP data plane here can move.
- memcpy_aligned_GBps: page-aligned mmap -> page-aligned mmap slice assignment: the most a
  shared-memory copy can move.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import socket
import statistics
import time

CHUNK_BYTES = 4 << 20


def _sender(port: int, total_bytes: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = memoryview(os.urandom(CHUNK_BYTES))
    sent = 0
    while sent < total_bytes:
        sock.sendall(payload)
        sent += CHUNK_BYTES
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)
    sock.close()


def tcp_loopback_GBps(total_bytes: int = 2 << 30) -> float:  # noqa: N802 - unit in name
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    proc = mp.get_context("spawn").Process(target=_sender, args=(port, total_bytes))
    proc.start()
    conn, _ = listener.accept()
    view = memoryview(bytearray(CHUNK_BYTES))
    got = 0
    start = time.perf_counter()
    while True:
        n = conn.recv_into(view)
        if n == 0:
            break
        got += n
    elapsed = time.perf_counter() - start
    conn.send(b"x")
    conn.close()
    listener.close()
    proc.join(30)
    return got / elapsed / 1e9


def memcpy_aligned_GBps(nbytes: int = 128 << 20, reps: int = 7) -> float:  # noqa: N802
    src, dst = mmap.mmap(-1, nbytes), mmap.mmap(-1, nbytes)
    src_view, dst_view = memoryview(src), memoryview(dst)
    src_view[:] = b"\x01" * nbytes
    dst_view[:] = src_view  # first touch
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        dst_view[:] = src_view
        rates.append(nbytes / (time.perf_counter() - start) / 1e9)
    del src_view, dst_view
    src.close()
    dst.close()
    return statistics.median(rates)


def measure(reps: int = 3) -> dict[str, float]:
    tcp = statistics.median(tcp_loopback_GBps() for _ in range(reps))
    return {"tcp_GBps": round(tcp, 3), "memcpy_aligned_GBps": round(memcpy_aligned_GBps(), 3)}
