"""`make bench-after-copy`: the storage node's own Python per WRITE, right after a payload landed.

    python -m cellar.bench.after_copy [--frames 400] [--out bench/results/after-copy-<date>-<host>.md]

Why
    `make profile` on 16 x 1 MiB tcp puts (2026-12-07) put ~35% of the node's CPU in the
    interpreter (perf: libpython), ~150-190 us per 1 MiB frame, where the same bookkeeping of a
    64 KiB frame costs ~12 us. The work per frame does not grow with its size; the CPU's caches
    do not hold it any more: the kernel's copy of the payload into segment memory streams the
    frame's bytes through L2 and evicts the interpreter's and the index's working set, so the
    Python that follows runs from L3 or memory. This bench measures that, with the node's own
    code and nothing else on the path.

What it runs
    The node's per-WRITE Python, the real code: `decode_request` and `decode_write_meta` of a
    packed frame, `NodeAccess.receiver` (grant MAC, key tag, sizes, the index admits the range
    and drops the older entry it overlaps, as on a busy node), then, after the payload,
    `NodeAccess.written` (the index seals the allocation, the receipt is signed) and `release`.
    The payload comes over a loopback TCP socket from a second process, received with
    MSG_WAITALL into the next range of a 512 MiB in-memory segment (as a node receives into
    fresh segment memory); it is not timed. Each frame size runs `--frames` frames after a
    warm-up; the report gives, per size, the median microseconds of the Python before the
    payload (admit) and after it (seal), their ratio to the smallest size's, and the copy's
    own time. The sender waits for a byte from the receiver before each payload, so nothing
    else runs during the timed Python.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any

from cellar.proto.grant import GRANT_OP_WRITE, key_tag, sign
from cellar.storage_node.access import NodeAccess
from cellar.storage_node.clock import MasterClock, wall_ms
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment
from cellar.transfer.frame import (
    OP_WRITE,
    REQUEST,
    WriteMeta,
    decode_request,
    decode_write_meta,
)
from cellar.transfer.tcp_plan import add_request

KiB, MiB = 1 << 10, 1 << 20
SIZES = (4 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB)
SEGMENT_BYTES = 512 * MiB
SEG = 1
EPOCH = 3
SECRET = bytes(range(32))
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _sender(port: int, sizes: tuple[int, ...], frames: int) -> None:
    """The child: for every frame, wait for one byte, then send that frame's payload."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = memoryview(os.urandom(max(sizes)))
    for size in sizes:
        for _ in range(frames):
            if not sock.recv(1):
                return
            sock.sendall(payload[:size])
    sock.close()


def _frame(access_secret: bytes, alloc_id: int, offset: int, size: int) -> tuple[bytes, bytes]:
    """(packed request header, packed write meta) of one whole-object WRITE, packed as the
    clients pack it (`tcp_plan.add_request`)."""
    grant = sign(access_secret, op=GRANT_OP_WRITE, segment_id=SEG, offset=offset, length=size,
                 alloc_id=alloc_id, epoch=EPOCH, expiry_ms=wall_ms() + 60_000,
                 tag=key_tag("bench", f"k{alloc_id}"))
    meta = WriteMeta(alloc_id, size, "bench", f"k{alloc_id}").pack()
    parts: list[bytes | memoryview] = []
    add_request(parts, OP_WRITE, alloc_id, (0, offset, (), size, grant), meta)
    head = bytes(parts[0])
    return head[:REQUEST.size], head[REQUEST.size:]


def run(frames: int, segment_bytes: int = SEGMENT_BYTES) -> dict[int, dict[str, float]]:
    """Per frame size: median admit, seal and copy times (us) of `frames` frames."""
    clock = MasterClock()
    clock.epoch = EPOCH
    segment = Segment.in_memory(SEG, segment_bytes)
    access = NodeAccess({SEG: segment}, ObjectIndex(allowed_skew_ms=1000), SECRET, clock,
                        allowed_skew_ms=1000)
    memory = memoryview(segment.memory)
    zeros = bytes(64 * MiB)
    for at in range(0, segment_bytes, len(zeros)):  # every page faulted in before the frames
        memory[at:at + len(zeros)] = zeros[:segment_bytes - at]
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        try:
            _sender(port, SIZES, frames)
        finally:
            os._exit(0)
    sock, _ = listener.accept()
    listener.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out: dict[int, dict[str, float]] = {}
    alloc_id = 1 << 20
    try:
        for size in SIZES:
            slots = segment_bytes // size
            admits, seals, copies = [], [], []
            for i in range(frames):
                alloc_id += 1
                offset = (i % slots) * size  # over the range of an older object, as on a busy node
                head, meta = _frame(SECRET, alloc_id, offset, size)
                sock.send(b"g")
                started = time.perf_counter()
                req = decode_request(head, max_payload_bytes=segment_bytes)
                wmeta = decode_write_meta(meta)
                target = access.receiver(req, wmeta)
                admitted = time.perf_counter()
                assert isinstance(target, memoryview)
                got = sock.recv_into(target, size, socket.MSG_WAITALL)
                landed = time.perf_counter()
                assert got == size
                receipt = access.written(req, wmeta)
                access.release(req)
                sealed = time.perf_counter()
                assert receipt, "a whole-object write seals its allocation"
                if i >= frames // 4:  # after a warm-up
                    admits.append(admitted - started)
                    copies.append(landed - admitted)
                    seals.append(sealed - landed)
            out[size] = {"admit_us": statistics.median(admits) * 1e6,
                         "seal_us": statistics.median(seals) * 1e6,
                         "copy_us": statistics.median(copies) * 1e6}
    finally:
        sock.close()
        os.waitpid(pid, 0)
    return out


def _caches() -> str:
    try:
        base = Path("/sys/devices/system/cpu/cpu0/cache")
        parts = []
        for index in sorted(base.glob("index*")):
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            if kind != "Instruction":
                parts.append(f"L{level} {(index / 'size').read_text().strip()}")
        return ", ".join(parts)
    except OSError:
        return "unknown"


def markdown(result: dict[int, dict[str, float]], frames: int) -> str:
    base = result[SIZES[0]]
    base_python = base["admit_us"] + base["seal_us"]
    lines = [
        f"The storage node's Python per WRITE after its payload landed "
        f"(`make bench-after-copy`), {dt.datetime.now():%Y-%m-%d %H:%M} on "
        f"{socket.gethostname()} ({os.cpu_count()} CPUs; caches of cpu0: {_caches()}); "
        f"{frames} frames a size, medians of the last three quarters.",
        "",
        "| frame | admit (us) | seal (us) | node Python per frame (us) | vs "
        f"{SIZES[0] // KiB} KiB | payload copy (us) |",
        "|---|---|---|---|---|---|",
    ]
    for size, row in result.items():
        python_us = row["admit_us"] + row["seal_us"]
        label = f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"
        lines.append(f"| {label} | {row['admit_us']:.1f} | {row['seal_us']:.1f} | "
                     f"{python_us:.1f} | {python_us / base_python:.2f}x | "
                     f"{row['copy_us']:.0f} |")
    lines += ["", "admit: decode_request, decode_write_meta, NodeAccess.receiver (grant MAC, key "
              "tag, sizes, index admit dropping the older entry); seal: NodeAccess.written "
              "(index seal, receipt) and release. Both run the same code for every size; what "
              "differs is what the copy before them left in the caches.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=400, help="frames per size (>= 8)")
    parser.add_argument("--out", type=Path, default=None, help="report file (default: "
                        "bench/results/after-copy-<date>-<host>.md)")
    args = parser.parse_args(argv)
    if args.frames < 8:
        parser.error("--frames must be >= 8")
    result = run(args.frames)
    text = markdown(result, args.frames)
    out: Any = args.out or DEFAULT_OUT / (
        f"after-copy-{dt.date.today():%Y-%m-%d}-{socket.gethostname()}.md")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print(text)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
