"""The token log: tokens the admin API creates or revokes outlive the master that took the call.

The problem. With HA masters each reads the token store file it was given (`tokens_file`: in
Kubernetes a read-only Secret, on separate hosts separate files). A token the admin API created
went into the leader's file alone, so after a failover the new leader refused it (a client
outage), and a revocation came undone the same way; where the file was read-only the API could
not create one at all.

The choice. Masters elected through etcd keep what the admin API creates and revokes in etcd,
one key per token id under `/cellar/<cluster>/tokens/`: a created token's record (its hash,
never the token) or a revocation marker `{"id": ..., "revoked": true}` (which also revokes a
token of the file). Written by the leader only (a transaction that holds only while its record
is the leader's) and answered only once written (503 otherwise, nothing changed); every leader
reads them at its election with the removal and tenant logs (coord/election.py) and lays them
over its file (`TokenStore.set_shared`). A single master keeps using its file.

Records are bounds-checked like anything off the wire (`MAX_RECORD_BYTES`, then
`cellar.tokens.parse_record`); an unreadable one is skipped with a log line.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import TYPE_CHECKING

from cellar.errors import ConfigError
from cellar.master.serving.removal_log import json_records
from cellar.tokens import TokenRecord, TokenStore, parse_record

if TYPE_CHECKING:
    from cellar.coord.election import LeaderElection

log = logging.getLogger("cellar.master")

MAX_RECORD_BYTES = 4096  # one record: an id, a kind, a tenant name, a hash, a label


class NotWritten(ConnectionError):
    """The change did not reach etcd (not the leader any more, or etcd failed): nothing changed."""


class EtcdTokenLog:
    """The HA token log over one `TokenStore`: the leader writes, every election loads."""

    def __init__(self, election: LeaderElection, store: TokenStore) -> None:
        self.election = election
        self.store = store
        self.writes = 0

    def load(self) -> None:
        """Lay the records and revocations the election read at its win over the store."""
        records: dict[str, TokenRecord] = {}
        revoked: set[str] = set()
        for token_id, raw in json_records(self.election.token_values,
                                          self.election.target.tokens_prefix, MAX_RECORD_BYTES,
                                          "token log"):
            try:
                if isinstance(raw, dict) and raw.get("revoked") is True:
                    if raw.get("id") != token_id:
                        raise ConfigError("tokens", f"revocation of {raw.get('id')!r} under {token_id!r}")
                    revoked.add(token_id)
                    continue
                record = parse_record(raw, "etcd")
                if record.id != token_id:
                    raise ConfigError("tokens", f"record {record.id!r} under {token_id!r}")
            except ConfigError as exc:
                log.warning("token log in etcd: record %r skipped: %s", token_id, exc)
                continue
            records[record.id] = record
        self.store.set_shared(records, revoked)
        if records or revoked:
            log.info("token log: %d token(s) and %d revocation(s) from etcd", len(records),
                     len(revoked))

    async def create(self, kind: str, tenant: str, *, shm: bool, label: str
                     ) -> tuple[TokenRecord, str]:
        """A new token, in etcd before it is usable or returned (ValueError: bad request)."""
        record, token = self.store.draft(kind, tenant, shm=shm, label=label)
        await self._write(record.id, asdict(record))
        self.store.add_shared(record)
        return record, token

    async def revoke(self, token_id: str) -> bool:
        """Revoke `token_id` (either layer) for every later leader too; False if unknown (the
        caller refreshed the store's file first, as for any token call)."""
        if not self.store.known(token_id):
            return False
        await self._write(token_id, {"id": token_id, "revoked": True})
        self.store.revoke_shared(token_id)
        return True

    async def _write(self, token_id: str, value: dict[str, object]) -> None:
        key = self.election.target.tokens_prefix + token_id
        if not await self.election.write_as_leader({key: json.dumps(value, sort_keys=True).encode()}):
            raise NotWritten("not the leader any more (or etcd failed): the token change was "
                             "not written; retry at the leader")
        self.writes += 1


__all__ = ["EtcdTokenLog", "NotWritten"]
