"""Process lifecycle shared by the master and the storage node: die with the parent if asked,
and a child's log file that only its owner can read (`open_private_log`).

What it owns
    `die_with_parent_if_asked()`, called first thing in `cellar master` and `cellar node`. When
    the environment names a parent (`CELLAR_PARENT_PID`, set by `LocalCluster`), the process
    asks the kernel for SIGTERM when that parent dies (Linux `PR_SET_PDEATHSIG`), then checks
    the parent is still the one named: if it already died before the request was made, the
    process exits at once.

Why here and not in the parent
    The parent used to make the prctl call in a `preexec_fn`, i.e. Python code between fork and
    exec. A parent with live gRPC channels (tests, the soak) then runs gRPC's at-fork handlers
    in the child, which sometimes abort it ("epoll_wait: Bad file descriptor", SIGABRT). Without
    a `preexec_fn`, subprocess execs straight after fork and the child does the call itself.

What it must never do
    Import anything beyond the standard library, or fail a start: without prctl (not Linux)
    it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import BinaryIO

PARENT_PID_ENV = "CELLAR_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent_if_asked() -> None:
    """If `CELLAR_PARENT_PID` is set, get SIGTERM when that process dies (exit now if it has)."""
    value = os.environ.pop(PARENT_PID_ENV, "")
    if not value or sys.platform != "linux":
        return
    try:
        parent_pid = int(value)
    except ValueError:
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        sys.exit(1)


def open_private_log(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for writing a child's log, created (or cut back to) mode 0600: a log
    names peers, node ids and token ids, so others on the host must not read it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its old mode through O_CREAT
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise
