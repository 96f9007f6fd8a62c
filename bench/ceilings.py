"""This machine's own limits for a KV store's data path, measured in the bench's own run.

- tcp_issue_GBps: the loopback ceiling exactly as issue 4 and ../shared/bench/limits.py define
  it: two processes, the sender `sendall`s one 4 MiB `bytes` over and over, the receiver
  `recv_into`s one preallocated 4 MiB bytearray. The issue's TCP targets are ratios to this.
- tcp_GBps: the same with both buffers page-aligned mmap memory (a bytearray's data starts 16-32
  bytes into its page; some copies run slower at that offset). Stricter than the issue's: the
  most any TCP data plane here can move; the table shows ratios to it too.
- tcp_cold_GBps: the same, but sending from and receiving into 64 MiB spans (16 different
  4 MiB chunks on each side, like a batch of 16 x 4 MiB objects moving between segment memory
  and client buffers). Not the issue's ceiling (targets are judged against tcp_GBps), but it
  shows how much of the gap to tcp_GBps is the memory system rather than the data plane: with
  a working set past the caches, the two kernel copies of loopback TCP run from DRAM.
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
COLD_SPAN_BYTES = 64 << 20


def _span(span_bytes: int) -> memoryview:
    """A page-aligned, pre-faulted buffer of span_bytes (a multiple of CHUNK_BYTES)."""
    buf = mmap.mmap(-1, span_bytes)
    view = memoryview(buf)
    fill = os.urandom(CHUNK_BYTES)
    for start in range(0, span_bytes, CHUNK_BYTES):
        view[start:start + CHUNK_BYTES] = fill
    return view


def _sender(port: int, total_bytes: int, span_bytes: int = CHUNK_BYTES,
            aligned: bool = True) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = _span(span_bytes) if aligned else memoryview(os.urandom(span_bytes))
    sent = 0
    while sent < total_bytes:
        start = sent % span_bytes
        sock.sendall(payload[start:start + CHUNK_BYTES])
        sent += CHUNK_BYTES
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)
    sock.close()


def tcp_loopback_GBps(total_bytes: int = 2 << 30,  # noqa: N802 - unit in name
                      span_bytes: int = CHUNK_BYTES, aligned: bool = True) -> float:
    """Receive total_bytes over loopback from a second process. aligned: page-aligned mmap
    buffers on both sides (else a bytes payload and a bytearray destination, as limits.py)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    proc = mp.get_context("spawn").Process(target=_sender,
                                             args=(port, total_bytes, span_bytes, aligned))
    proc.start()
    conn, _ = listener.accept()
    view = _span(span_bytes) if aligned else memoryview(bytearray(span_bytes))
    got = pos = 0
    start = time.perf_counter()
    while True:
        n = conn.recv_into(view[pos:pos + CHUNK_BYTES])
        if n == 0:
            break
        got += n
        pos = (pos + n) % span_bytes
        if pos + CHUNK_BYTES > span_bytes:
            pos = 0
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
    issue = statistics.median(tcp_loopback_GBps(aligned=False) for _ in range(reps))
    tcp = statistics.median(tcp_loopback_GBps() for _ in range(reps))
    cold = statistics.median(tcp_loopback_GBps(1 << 30, COLD_SPAN_BYTES) for _ in range(reps))
    return {"tcp_issue_GBps": round(issue, 3), "tcp_GBps": round(tcp, 3),
            "tcp_cold_GBps": round(cold, 3),
            "memcpy_aligned_GBps": round(memcpy_aligned_GBps(), 3)}
