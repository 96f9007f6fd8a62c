"""The guest's halt-poll window: a machine setting that moves small-operation figures 2-3x.

Why the benches name it
    On a KVM guest with the `cpuidle-haltpoll` driver, an idle vCPU polls for
    `guest_halt_poll_ns` before it halts (sysfs, below). With 0 (the VMs Cellar is measured on)
    it halts at once, and waking it costs an interrupt through the hypervisor, about 50-60 us
    (transfer/spin_wait.py). Cellar's SDK and nodes spin for a reply due within microseconds, so
    they pay it once; Mooncake Store and Valkey do not spin and pay it on every call. Measured
    on 2026-12-06 (bench-peers, single 64 KiB put p50): Valkey 124 -> 60 us and Mooncake 261 ->
    103 us at 200,000 ns, Cellar 233 -> 198-239 us (docs/benchmarks.md, "Guest halt polling").
    A side-by-side report that does not say the window is not comparable with one that does.

What it owns
    `read_ns()`: the window in effect (None where the driver is absent: bare metal, other
    hypervisors). `window(ns)`: a context that sets it for a run and puts the old value back
    (root only; for the A/B `make bench-peers PEERS_ARGS="--guest-halt-poll-ns 200000"`).

What it must never do
    Change the machine unless asked, or leave it changed: `window` restores on every exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PARAM = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
MAX_WINDOW_NS = 10_000_000  # 10 ms: past this a vCPU is not idle, it is burnt


def read_ns(param: Path = PARAM) -> int | None:
    """The guest's halt-poll window in nanoseconds, or None where there is none to read."""
    try:
        return int(param.read_text().strip())
    except (OSError, ValueError):
        return None


def describe(ns: int | None) -> str:
    """One phrase for a report's header."""
    if ns is None:
        return "guest halt polling: none here (no cpuidle-haltpoll driver)"
    return (f"guest halt polling (cpuidle-haltpoll `guest_halt_poll_ns`): {ns:,} ns"
            + (" (an idle vCPU halts at once)" if ns == 0 else ""))


@contextmanager
def window(ns: int | None, param: Path = PARAM) -> Iterator[int | None]:
    """Run with the window set to `ns` (None: leave it as it is); yields the window in effect."""
    if ns is None:
        yield read_ns(param)
        return
    if not 0 <= ns <= MAX_WINDOW_NS:
        raise ValueError(f"a halt-poll window must be 0..{MAX_WINDOW_NS} ns, got {ns}")
    before = read_ns(param)
    if before is None:
        raise RuntimeError(f"no halt-poll window to set here ({param} is not readable)")
    try:
        param.write_text(str(ns))
    except OSError as exc:
        raise RuntimeError(f"cannot set {param} (root only): {exc}") from None
    try:
        yield ns
    finally:
        param.write_text(str(before))
