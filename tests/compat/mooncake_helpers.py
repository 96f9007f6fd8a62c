"""Helpers shared by the Mooncake-compatibility tests (imported by path: tests/compat is on
sys.path while they run)."""

from __future__ import annotations

import ctypes
from typing import Any

from cellar.devtools.local_cluster import LocalCluster

OTHER_TENANT = "mc-other"  # a second tenant the shared test cluster knows


def setup_args(cluster: LocalCluster, *, segment: Any = 0, local_buffer: Any = "16MB",
               protocol: str = "tcp") -> tuple[Any, ...]:
    """Mooncake's seven positional setup arguments for `cluster`."""
    return ("127.0.0.1", "P2PHANDSHAKE", segment, local_buffer, protocol, "", cluster.address)


class Buffers:
    """ctypes buffers kept alive for one test; `.ptr(buf)` is the address Mooncake takes."""

    def __init__(self) -> None:
        self._keep: list[Any] = []

    def make(self, nbytes: int, fill: bytes | None = None) -> Any:
        buf = (ctypes.c_ubyte * nbytes)()
        if fill is not None:
            ctypes.memmove(buf, fill, min(nbytes, len(fill)))
        self._keep.append(buf)
        return buf

    @staticmethod
    def ptr(buf: Any) -> int:
        return ctypes.addressof(buf)

    @staticmethod
    def read(buf: Any, nbytes: int | None = None, offset: int = 0) -> bytes:
        data = bytes(buf)
        return data[offset:] if nbytes is None else data[offset:offset + nbytes]
