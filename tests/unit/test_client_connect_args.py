"""Connect arguments shared by both faces (cellar.client.connect_args / checks): the credential
lookup order and the gRPC refusals it can meet."""

from __future__ import annotations

import sys
import types

import grpc
import pytest

import cellar
from cellar.client import checks, statuses
from cellar.client.connect_args import ConnectArgs


def test_token_order_explicit_then_env_then_the_token_file(monkeypatch):
    monkeypatch.delenv("CELLAR_TOKEN", raising=False)
    fake = types.ModuleType("cellar.credentials")
    asked: list[str] = []

    def default_token(address: str) -> str | None:
        asked.append(address)
        return "from-file"

    fake.default_token = default_token  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cellar.credentials", fake)
    assert checks.resolve_token("m:1", None) == "from-file" and asked == ["m:1"]
    monkeypatch.setenv("CELLAR_TOKEN", "from-env")
    assert checks.resolve_token("m:1", None) == "from-env"
    assert checks.resolve_token("m:1", "explicit") == "explicit"
    assert ConnectArgs.check("m:1", "t", None, 1.0, "tcp").header().token == "from-env"
    with pytest.raises(cellar.InvalidArgument, match="token"):
        checks.resolve_token("m:1", b"bytes")


def test_refusals_map_to_typed_errors():
    assert isinstance(statuses.grpc_error("Get", "m:1", grpc.StatusCode.UNAUTHENTICATED, "no"),
                      cellar.Unauthenticated)
    denied = statuses.grpc_error("Get", "m:1", grpc.StatusCode.PERMISSION_DENIED, "no")
    assert type(denied) is cellar.PermissionDenied
    assert issubclass(cellar.Unauthenticated, cellar.PermissionDenied)


@pytest.mark.parametrize("kwargs, match", [
    ({"address": 5}, "address"), ({"address": "nope"}, "host:port"), ({"tenant": ""}, "tenant"),
    ({"timeout_s": -1}, "timeout_s"), ({"transport": "pigeon"}, "transport"),
])
def test_connect_arguments_are_checked_once_for_both_faces(kwargs, match):
    args = {"address": "m:1", "tenant": "t", "token": None, "timeout_s": 1.0, "transport": "tcp"}
    args.update(kwargs)
    with pytest.raises(cellar.InvalidArgument, match=match):
        ConnectArgs.check(**args)
