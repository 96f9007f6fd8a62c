"""The TCP data server's socket I/O under deadlines: frames in, corked replies out.

What it owns: `IoTimer`, the kernel timeout of one connection (SO_RCVTIMEO and SO_SNDTIMEO,
set together by `set_io_timeout`); `DeadlineInbox`, whose receives for one frame end by one
deadline; `HoldingOutbox`, corked replies whose sends end by the deadline of the READ replies
they carry, and which hands each such read back to the access layer (`release`) once its reply
is with the kernel; `Bounces`, the buffers of payloads bound for a disk-backed file.

The kernel timeout follows the nearest deadline without a syscall per op: it is lowered only
when a call could overshoot its deadline by more than REARM_SLACK_S, and never raised eagerly;
a call it cuts short before its own deadline (a later one: an idle wait after a short-lived
grant's transfer) sets it to what is left and goes on, one syscall per such wakeup. A plain
socket's recv or sendmsg cut short returns the bytes it moved (or EAGAIN with none), and a TLS
socket keeps what it moved (tls_sock.py), so going on loses nothing.

Why deadlines tied to grants: the master reasons in time about a range it freed (it flags shm
writers to claim while a read grant of the freed object could live, and quarantines a revoked
put's range until its write grant's expiry plus the skew). A transfer that outlives its grant
breaks that reasoning, so the server closes the connection of one that would (transfer/base.py
`time_left_s`). It never interprets grants itself.
"""

from __future__ import annotations

import mmap
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from cellar.transfer._sockio import (
    MAX_IOV,
    TIMEOUT_ERRORS,
    Buffer,
    Inbox,
    Outbox,
    advance_views,
    set_io_timeout,
)
from cellar.transfer.frame import RequestHeader

# A deadline lowers the kernel timeout only once a call could overshoot it by more than this,
# so a connection that keeps up costs no setsockopt per frame. Also the most a transfer can
# outlive its grant by (docs/security.md), within the master's grant_skew_s (1 s by default).
REARM_SLACK_S = 1.0
# A payload bound for a disk-backed file crosses a buffer of this size (one per connection
# receiving one; at most BOUNCES_KEPT kept between writes): FileRange says why.
FILE_CHUNK_BYTES = 1 << 20
BOUNCES_KEPT = 4
_NEVER = float("inf")


class FrameTimeout(TimeoutError):
    """A frame, or a reply, did not move within its deadline: the connection is closed."""


class IoTimer:
    """The kernel timeout of one connection's socket (module docstring)."""

    __slots__ = ("_sock", "armed_s")

    def __init__(self, sock: socket.socket, armed_s: float) -> None:
        self._sock = sock
        self.armed_s = armed_s  # what set_io_timeout last set on the socket

    def fit(self, left_s: float) -> None:
        """Lower the timeout if one call could overshoot a deadline `left_s` away by more
        than REARM_SLACK_S."""
        if left_s < self.armed_s - REARM_SLACK_S:
            self.set(left_s)

    def set(self, seconds: float) -> None:
        set_io_timeout(self._sock, seconds)
        self.armed_s = seconds

    def cut_short(self, deadline: float) -> None:
        """A call timed out: FrameTimeout if `deadline` (time.monotonic()) passed, else the
        timeout was set for a nearer deadline than this one: set it to what is left."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise FrameTimeout("deadline passed") from None
        self.set(left)


class DeadlineInbox(Inbox):
    """An Inbox whose receives are bounded by one deadline per frame (tcp_server.py says
    which deadlines: a header's, a payload's)."""

    __slots__ = ("deadline", "arm", "timer")

    def __init__(self, sock: socket.socket, size: int, timer: IoTimer, **kw: Any) -> None:
        super().__init__(sock, size, **kw)
        self.timer = timer
        self.deadline = 0.0
        self.arm = False

    def expect(self, within_s: float, *, arm: bool) -> None:
        """The bytes read from now on for this frame are due within `within_s`; with `arm`
        the kernel timeout is lowered to keep to it (a slow frame is cut within
        REARM_SLACK_S of its deadline)."""
        self.deadline = time.monotonic() + within_s
        self.arm = arm

    def _recv_into(self, view: memoryview, flags: int = 0, *, mid_payload: bool = False) -> int:
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise FrameTimeout("frame deadline passed")
            if self.arm:
                self.timer.fit(left)
            try:
                return Inbox._recv_into(self, view, flags, mid_payload=mid_payload)
            except FrameTimeout:  # a reply's deadline (HoldingOutbox)
                raise
            except TIMEOUT_ERRORS:
                self.timer.cut_short(self.deadline)


class HoldingOutbox(Outbox):
    """Corked replies (Outbox) that also carry the READs whose replies are views of segment
    memory: each is released to the access layer once its reply is with the kernel, and the
    replies must leave by the earliest of their deadlines (their grants' expiry)."""

    __slots__ = ("timer", "idle_timeout_s", "release", "held", "held_deadline")

    def __init__(self, sock: socket.socket, timer: IoTimer, idle_timeout_s: float,
                 release: Callable[[RequestHeader], None] | None, **kw: Any) -> None:
        super().__init__(sock, **kw)
        self.timer = timer
        self.idle_timeout_s = idle_timeout_s  # a send of replies holding no read
        self.release = release
        self.held: list[RequestHeader] = []  # reads whose replies are queued or being sent
        self.held_deadline = _NEVER

    def add_held(self, part: bytes, payload: memoryview, request: RequestHeader,
                 deadline: float) -> None:
        """Queue a READ reply (its payload a view of segment memory), held until sent."""
        if self.release is not None:
            self.held.append(request)
        if deadline < self.held_deadline:
            self.held_deadline = deadline
        self.add(part, payload)

    def _send(self, parts: list[Buffer]) -> None:
        deadline = min(self.held_deadline, time.monotonic() + self.idle_timeout_s)
        views = [p if isinstance(p, memoryview) else memoryview(p) for p in parts if len(p)]
        sock = self._sock
        while views:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FrameTimeout("replies not taken before their deadline")
            self.timer.fit(left)
            try:
                advance_views(views, sock.sendmsg(views[:MAX_IOV]))
            except TIMEOUT_ERRORS:
                self.timer.cut_short(deadline)
        self.held_deadline = _NEVER
        if self.held:
            held, self.held = self.held, []
            self.release_all(held)

    def release_all(self, held: list[RequestHeader] | None = None) -> None:
        """Release `held` (default: every read still held; the connection is going)."""
        if held is None:
            held, self.held = self.held, []
        assert self.release is not None or not held
        for request in held:
            self.release(request)  # type: ignore[misc]


class Bounces:
    """Page-aligned FILE_CHUNK_BYTES buffers for payloads bound for a file; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[memoryview] = []

    def take(self) -> memoryview:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return memoryview(mmap.mmap(-1, FILE_CHUNK_BYTES))

    def give_back(self, bounce: memoryview) -> None:
        with self._lock:
            if len(self._idle) < BOUNCES_KEPT:
                self._idle.append(bounce)
