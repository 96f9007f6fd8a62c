"""Spin, then block: waiting for a reply due within microseconds without a wake-up.

Why
    On the VMs Cellar is measured on, an idle vCPU halts at once (the guest's haltpoll window
    is 0), and waking a thread whose vCPU halted costs an interrupt through the hypervisor:
    about 50-60 us a wake-up, measured as the gap between a client and master pinned to one
    vCPU and the same pair free to use both. A fast-line call pays it twice (the master woken
    by the request, the client by the reply). A caller that polls its socket for a short
    window keeps its vCPU running, so the reply lands without the second wake-up (`make
    bench-spin`, p50: a 1-key prefix_len 192-195 -> 107-124 us, a 256-key lookup 327-356 ->
    250-274 us). The SDK spins where a reply is due within microseconds: the master's probes
    and one-key requests (client/rpc.py), tcp transfers of one chunk (transfer/tcp.py), and
    the lone COMMIT of a single put over shm (transfer/control.py). A storage node's data
    server spins the same way for the next request on a connection that proved a grant
    (transfer/tcp_server.py `spin_us`, the node's `data_spin_us`): a client's next write,
    read or COMMIT then lands on a running vCPU (a single 64 KiB tcp put 380-392 -> 284-297 us
    p50, a read within its trust 126 -> 87-90 us; docs/sdk.md). Where the guest polls before
    it halts (`guest_halt_poll_ns` > 0) the kernel gives the same and spinning adds little:
    single 64 KiB puts and gets ran as fast with it off there (bench/halt_poll.py says more).

What it costs and how that is bounded
    CPU of the calling thread, at most the window per call:
    - the window: `CELLAR_SPIN_US` (microseconds, default 300, 0 turns spinning off, at most
      MAX_SPIN_US), read once per connect (client/checks.py);
    - one spinner per process, whatever it waits on: a thread that finds another one spinning
      blocks at once (on a 2-core machine two spinning threads would take the CPU the master
      and node need), and background threads nobody waits on never spin;
    - a window that keeps expiring turns itself off: after MISSES_BEFORE_REST windows in a row
      ended with no reply (a loaded or remote master), the next REST_CALLS calls block at once,
      then one spins again to see whether replies are back within the window.

The polling runs in the native helper `_spin` with the GIL released (a loop of poll(0) and
sched_yield: a server the kernel woke onto this vCPU runs at once instead of after the window).
Spinning in Python would hold the GIL between polls, and the process's other threads (the put
hasher, the unpin flusher, other callers) would get it only in the gaps; so where the helper
is not built (no C compiler at install), the SDK does not spin (`NATIVE` False). Batches never
spin: while the master or node works through one, the spinning vCPU is one they need (batches
of 16 x 64 KiB lost 13-14% when they spun).

It never reads or consumes a byte: it only returns once the socket is readable or the window is
over, and the caller's blocking read (with its own timeout) follows either way.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

__all__ = ["DEFAULT_SPIN_US", "MAX_SPIN_US", "SPIN_ENV", "SpinWait", "never_spin_in_this_thread"]

SPIN_ENV = "CELLAR_SPIN_US"
DEFAULT_SPIN_US = 300
MAX_SPIN_US = 10_000  # a window past 10 ms is no longer "due within microseconds"
MISSES_BEFORE_REST = 4
REST_CALLS = 64


_SPINNER = threading.Lock()  # held by the one thread of this process that spins
_THREAD = threading.local()   # .never: this thread's calls never spin (background work)


def never_spin_in_this_thread() -> None:
    """Calls made from this thread block at once: for background threads nobody waits on
    (the SDK's unpin flusher), whose spinning would only take CPU from the callers'."""
    _THREAD.never = True

_spin: Callable[[int, int], bool] | None = None
try:  # the native helper (setup.py builds it when a C compiler is there)
    from cellar.transfer import _spin as _native

    _spin = _native.spin
except ImportError:  # pragma: no cover - depends on the install
    pass
NATIVE = _spin is not None


class SpinWait:
    """One client's window and its rest state, shared by the connections it waits on."""

    def __init__(self, spin_us: int) -> None:
        if not 0 <= spin_us <= MAX_SPIN_US:
            raise ValueError(f"spin_us must be in 0..{MAX_SPIN_US}, got {spin_us}")
        self.window_ns = spin_us * 1000 if NATIVE else 0
        self._misses = 0       # windows in a row that ended with no reply
        self._rest_left = 0    # calls that block at once before the next try
        self.spins = 0         # windows spun (for tests and the bench's notes)
        self.hits = 0          # of which the reply arrived within the window

    def wait(self, sock: socket.socket) -> bool:
        """Poll `sock` until readable or the window ends; True if it became readable."""
        if self.window_ns <= 0:
            return False
        if self._rest_left > 0:
            self._rest_left -= 1
            return False
        if getattr(_THREAD, "never", False) or not _SPINNER.acquire(blocking=False):
            return False
        try:
            self.spins += 1
            assert _spin is not None
            if _spin(sock.fileno(), self.window_ns):
                self._misses = 0
                self.hits += 1
                return True
            self._misses += 1
            if self._misses >= MISSES_BEFORE_REST:
                self._misses = 0
                self._rest_left = REST_CALLS
            return False
        finally:
            _SPINNER.release()
