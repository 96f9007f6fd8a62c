"""Helpers of the security tests (importable by name: `from identity_kit import ...`)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from cellar.devtools.local_cluster import LocalCluster


class SecurityCluster(LocalCluster):
    """A LocalCluster with tenants alice and bob and a token of each."""

    alice: str
    bob: str


def code_of(call: Any) -> grpc.StatusCode:
    """The gRPC status code `call()` fails with (pytest.fail if it succeeds)."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    pytest.fail("the call succeeded")
