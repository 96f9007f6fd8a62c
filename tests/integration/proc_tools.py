"""/proc helpers for tests that check a launcher leaves no process behind (no tests here)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import IO


def children_of(pid: int) -> list[int]:
    """Pids whose parent is `pid`, read from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def read_lines_until(stream: IO[str], done: Callable[[str], object],
                     timeout_s: float = 60.0) -> list[str]:
    """A child's output lines (newline stripped) up to and including the first one `done`
    accepts, or all of them until end of file or `timeout_s` (checked between lines)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if done(lines[-1]):
            break
    return lines
