"""The token store's shared layer and the HA token log's reading and writing
(master/serving/token_log.py), against a stand-in election (the real one, with etcd, is
tests/integration/test_token_log_ha.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from cellar.master.serving.token_log import EtcdTokenLog, NotWritten
from cellar.tokens import KIND_ADMIN, KIND_TENANT, TokenStore

PREFIX = "/cellar/c/tokens/"


class Target:
    tokens_prefix = PREFIX


class Election:
    def __init__(self, leader: bool = True) -> None:
        self.target = Target()
        self.token_values: list[tuple[bytes, bytes]] = []
        self.leader = leader
        self.written: dict[str, bytes] = {}

    async def write_as_leader(self, puts: dict[str, bytes]) -> bool:
        if not self.leader:
            return False
        self.written.update(puts)
        return True


def test_the_shared_layer_adds_tokens_and_revokes_file_ones(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "tokens.json")
    _, file_token = store.create(KIND_TENANT, "a")
    record, shared_token = store.draft(KIND_ADMIN)
    assert store.lookup(shared_token) is None  # a draft is kept nowhere
    generation = store.generation
    store.set_shared({record.id: record}, {file_token.split("_")[1]})
    assert store.generation > generation  # the authorizer drops its cached lookups
    assert store.lookup(shared_token) == record
    assert store.lookup(file_token) is None
    assert [r.id for r in store.records()] == [record.id] and len(store) == 1
    assert not store.known(file_token.split("_")[1]) and store.known(record.id)
    store.set_shared({}, set())  # another leader's view: the file's token is back
    assert store.lookup(file_token) is not None and store.lookup(shared_token) is None


def test_load_takes_records_and_revocations_and_skips_what_does_not_parse(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "tokens.json")
    _, file_token = store.create(KIND_TENANT, "a")
    file_id = file_token.split("_")[1]
    good, good_token = store.draft(KIND_TENANT, "b")
    election = Election()
    election.token_values = [
        ((PREFIX + good.id).encode(), json.dumps(asdict(good)).encode()),
        ((PREFIX + file_id).encode(), json.dumps({"id": file_id, "revoked": True}).encode()),
        ((PREFIX + "aaaaaaaaaaaa").encode(), b"not json"),
        ((PREFIX + "bbbbbbbbbbbb").encode(), json.dumps({**asdict(good), "id": "cccccccccccc"}).encode()),
        ((PREFIX + "dddddddddddd").encode(), json.dumps({"id": "eeeeeeeeeeee", "revoked": True}).encode()),
        ((PREFIX + "ffffffffffff").encode(), json.dumps({"id": "ffffffffffff", "kind": "root",
                                                          "sha256": "0"}).encode()),
        ((PREFIX + "999999999999").encode(), b"{" + b" " * 5000 + b"}"),
    ]
    EtcdTokenLog(election, store).load()  # type: ignore[arg-type]
    assert store.lookup(good_token) == good
    assert store.lookup(file_token) is None
    assert {r.id for r in store.records()} == {good.id}
    assert not store.known("eeeeeeeeeeee") and not store.known("dddddddddddd")


def test_create_and_revoke_write_etcd_first_and_change_nothing_when_refused(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "tokens.json")
    _, file_token = store.create(KIND_TENANT, "a")
    file_bytes = (tmp_path / "tokens.json").read_bytes()
    election = Election()
    tokens = EtcdTokenLog(election, store)  # type: ignore[arg-type]
    record, token = asyncio.run(tokens.create(KIND_TENANT, "b", shm=False, label="x"))
    assert json.loads(election.written[PREFIX + record.id])["sha256"] == record.sha256
    assert token not in election.written[PREFIX + record.id].decode()  # the hash, never the token
    assert store.lookup(token) == record
    assert asyncio.run(tokens.revoke(file_token.split("_")[1]))
    assert store.lookup(file_token) is None
    assert (tmp_path / "tokens.json").read_bytes() == file_bytes  # the file is never written
    assert not asyncio.run(tokens.revoke("000000000000"))  # unknown: nothing written
    assert PREFIX + "000000000000" not in election.written
    election.leader = False  # deposed: refused, and nothing changes
    with pytest.raises(NotWritten):
        asyncio.run(tokens.create(KIND_TENANT, "c", shm=False, label=""))
    with pytest.raises(NotWritten):
        asyncio.run(tokens.revoke(record.id))
    assert store.lookup(token) == record and len(store) == 1
    with pytest.raises(ValueError):
        asyncio.run(tokens.create("root", "", shm=False, label=""))


