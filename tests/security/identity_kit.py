"""Helpers of the security tests (importable by name: `from identity_kit import ...`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from cellar.devtools.local_cluster import LocalCluster


class SecurityCluster(LocalCluster):
    """A LocalCluster with tenants alice and bob and a token of each."""

    alice: str
    bob: str


@contextmanager
def running(c: SecurityCluster) -> Iterator[SecurityCluster]:
    """`c` started, stopped at the end; on a failure the tail of every process log is printed."""
    try:
        c.start()
        yield c
    except BaseException:
        for path in sorted(Path(c.run_dir).glob("*.log")):
            print(f"---- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-20:]))
        raise
    finally:
        c.stop()


def code_of(call: Any) -> grpc.StatusCode:
    """The gRPC status code `call()` fails with (pytest.fail if it succeeds)."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    pytest.fail("the call succeeded")
