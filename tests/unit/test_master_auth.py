"""The Authorizer's policy and the token store, without processes (cellar.master.serving.auth,
cellar.tokens); the same checks against real masters are in tests/security/."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cellar.master.serving.auth import (
    METHOD_POLICY,
    PERMISSION_DENIED,
    UNAUTHENTICATED,
    Authorizer,
    AuthRefused,
)
from cellar.master.serving.servicer import MasterServicer
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import node_credential, verify_node_credential
from cellar.tokens import KIND_ADMIN, KIND_TENANT, TokenStore, token_id_of

SECRET = bytes(range(32))


def refused(authorizer: Authorizer, method: str, request: object) -> tuple[str, str]:
    with pytest.raises(AuthRefused) as info:
        authorizer.check(method, request)
    return info.value.code, info.value.reason


def test_every_rpc_has_a_policy() -> None:
    assert set(METHOD_POLICY) == set(MasterServicer._messages()) | {"WatchKvEvents"}  # + the stream
    assert set(METHOD_POLICY) == {m.name for m in pb.DESCRIPTOR.services_by_name["Master"].methods}


def test_tenant_tokens_act_as_their_tenant_only() -> None:
    store = TokenStore(None)
    token = store.create(KIND_TENANT, "alice")[1]
    auth = Authorizer(store, SECRET)
    request = pb.KeysRequest(header=pb.RequestHeader(token=token), keys=["k"])
    assert auth.check("Exists", request).tenant == "alice"
    assert request.header.tenant == "alice"  # an empty claim is filled in from the token
    claims_bob = pb.KeysRequest(header=pb.RequestHeader(tenant="bob", token=token))
    assert refused(auth, "Exists", claims_bob) == (PERMISSION_DENIED, "foreign_tenant")
    mount = pb.MountSegmentRequest(header=pb.RequestHeader(token=token), node_id="n1")
    assert refused(auth, "MountSegment", mount) == (PERMISSION_DENIED, "not_a_node")
    assert refused(auth, "NoSuchRpc", request) == (PERMISSION_DENIED, "unknown_rpc")
    assert auth.refusals == {"foreign_tenant": 1, "not_a_node": 1, "unknown_rpc": 1}


def test_node_credentials_name_one_node() -> None:
    auth = Authorizer(TokenStore(None), SECRET)
    token = node_credential(SECRET, "node_7")
    assert verify_node_credential(SECRET, token) == "node_7"
    own = pb.HeartbeatRequest(header=pb.RequestHeader(token=token), node_id="node_7")
    assert auth.check("Heartbeat", own).node_id == "node_7"
    other = pb.HeartbeatRequest(header=pb.RequestHeader(token=token), node_id="node_8")
    assert refused(auth, "Heartbeat", other) == (PERMISSION_DENIED, "foreign_node")
    data = pb.KeysRequest(header=pb.RequestHeader(token=token))
    assert refused(auth, "Remove", data) == (PERMISSION_DENIED, "not_a_client")
    tampered = token[:-1] + ("8" if token[-1] != "8" else "9")  # claims another node id
    assert verify_node_credential(SECRET, tampered) is None
    for bad in ("", "cellarnode_", "cellarnode_00_x", node_credential(bytes(32), "node_7")):
        request = pb.HeartbeatRequest(header=pb.RequestHeader(token=bad), node_id="node_7")
        assert refused(auth, "Heartbeat", request)[0] == UNAUTHENTICATED


def test_revocation_and_file_changes_apply_at_once(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    store = TokenStore(path)
    record, token = store.create(KIND_ADMIN, label="ops")
    auth = Authorizer(store, SECRET)
    request = pb.RemoveAllRequest(header=pb.RequestHeader(tenant="anyone", token=token))
    assert auth.check("RemoveAll", request).admin  # an admin acts as any tenant
    assert store.revoke(record.id)
    assert refused(auth, "RemoveAll", request) == (UNAUTHENTICATED, "bad_token")
    # another process adds a token to the file: an unknown token re-reads it
    other = TokenStore(path)
    later = other.create(KIND_TENANT, "carol")[1]
    later_request = pb.KeysRequest(header=pb.RequestHeader(token=later))
    assert auth.check("Exists", later_request).tenant == "carol"


def test_the_store_keeps_hashes_only_in_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    store = TokenStore(path)
    record, token = store.create(KIND_TENANT, "alice", shm=True)
    text = path.read_text()
    assert token not in text and token.split("_", 2)[2] not in text  # the whole secret
    assert (os.stat(path).st_mode & 0o777) == 0o600
    assert json.loads(text)["tokens"][0]["id"] == record.id == token_id_of(token)
    assert TokenStore(path).lookup(token) == record
    assert TokenStore(path).lookup(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    with pytest.raises(ValueError):
        store.create(KIND_TENANT, "")
    with pytest.raises(ValueError):
        store.add(KIND_ADMIN, "not-a-token")


def test_a_broken_store_file_keeps_the_tokens_read_before(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    store = TokenStore(path)
    token = store.create(KIND_TENANT, "alice")[1]
    auth = Authorizer(store, SECRET)
    path.write_text("{not json")  # a hand edit gone wrong, while the master runs
    os.utime(path, ns=(1, 1))  # a new mtime, surely
    assert not auth.refresh()
    request = pb.KeysRequest(header=pb.RequestHeader(token=token))
    assert auth.check("Exists", request).tenant == "alice"
    unknown = pb.KeysRequest(header=pb.RequestHeader(token="cellar_" + "1" * 12 + "_" + "B" * 43))
    assert refused(auth, "Exists", unknown) == (UNAUTHENTICATED, "bad_token")
