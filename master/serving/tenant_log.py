"""The tenant log: tenants the admin API set outlive the master that took the request.

The problem. `PUT /api/v1/tenants` creates a tenant or changes its quotas in the leader's
memory. A master restart or a failover rebuilt the tenant table from the config file alone, so
a tenant created through the API was unknown to the next master: its objects were not adopted
from the nodes' reports (dropped, their ranges freed) and its tokens were refused ("unknown
tenant"). Its quotas changed through the API went back to the config's.

The choice. Every accepted `PUT /api/v1/tenants` is written here before it takes effect and is
answered (a write that fails answers 503 and changes nothing); a master loads the log before
it adopts any report: at start (a single master) or at each election (HA, the election reads it
with the removal log, coord/election.py). What the API set last for a tenant wins over the
config file's entry for it, across restarts, until the API sets it again.

Two backends, one interface (`load` -> {name: quota fields}; `write(name, fields)`, awaited):
- `FileTenantLog` (a single master): one JSON object {name: fields}, rewritten whole with an
  atomic rename and fsync on each change (admin changes are rare; at most `max_tenants`
  entries). `~/.cellar/tenants-<listen>.json` by default, beside the removal log.
- `EtcdTenantLog` (HA): one key per tenant under `/cellar/<cluster>/tenants/`, written in a
  transaction that holds only while this master's record is the leader's.
Records are the fields `master.config.parse_tenant_quota` takes, and go through it again on
load (bounds-checked like anything off the wire); an unreadable one is skipped with a log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cellar.errors import ConfigError
from cellar.master.config import parse_tenant_quota
from cellar.master.serving.removal_log import json_records, listen_file, replace_file
from cellar.master.state.records import TenantQuota

if TYPE_CHECKING:
    from cellar.coord.election import LeaderElection

log = logging.getLogger("cellar.master")

DISABLED = "none"                     # tenant_log_file value that turns the file log off
MAX_FILE_BYTES = 64 << 20             # the file log, read whole at a start
MAX_RECORD_BYTES = 4096               # one tenant's fields (a few numbers and a flag)


def fields_of(quota: TenantQuota) -> dict[str, Any]:
    """The `parse_tenant_quota` fields that give `quota` back (no quota_bytes: the default)."""
    fields: dict[str, Any] = {
        "quota_objects": quota.quota_objects,
        "quota_writing_bytes": quota.quota_writing_bytes,
        "hard_pin": quota.hard_pin,
        "quota_hard_pin_bytes": quota.quota_hard_pin_bytes,
    }
    if not quota.default_bytes:
        fields["quota_bytes"] = quota.quota_bytes
    return fields


def parse_records(records: dict[str, Any], where: str) -> dict[str, TenantQuota]:
    """{name: fields} off disk or etcd -> {name: TenantQuota}, skipping what does not parse."""
    quotas: dict[str, TenantQuota] = {}
    for name, fields in records.items():
        try:
            quotas[name] = parse_tenant_quota(name, fields, field=where)
        except ConfigError as exc:
            log.warning("tenant log %s: record of %r skipped: %s", where, name, exc)
    return quotas


def default_path(listen: str) -> Path:
    """~/.cellar/tenants-<listen address>.json: one per master address on this host."""
    return listen_file("tenants", listen, ".json")


class FileTenantLog:
    """A single master's tenant log: one JSON file, rewritten atomically on each change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._records: dict[str, dict[str, Any]] = {}
        self.writes = 0

    def load(self) -> dict[str, TenantQuota]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return {}
        if len(data) > MAX_FILE_BYTES:
            raise OSError(f"tenant log {self.path} is over {MAX_FILE_BYTES} bytes")
        try:
            records = json.loads(data) if data else {}
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise OSError(f"tenant log {self.path} is not JSON: {exc}") from None
        if not isinstance(records, dict):
            raise OSError(f"tenant log {self.path}: expected a JSON object of tenants")
        quotas = parse_records(records, str(self.path))
        self._records = {name: fields_of(quota) for name, quota in quotas.items()}
        return quotas

    async def write(self, name: str, quota: TenantQuota) -> None:
        """One rewrite at a time: the caller (Leadership.set_tenant) holds its lock across it,
        else two PUTs in flight would each write the file without the other's tenant."""
        records = {**self._records, name: fields_of(quota)}
        await asyncio.to_thread(replace_file, self.path,
                                json.dumps(records, sort_keys=True).encode())
        self._records = records
        self.writes += 1


class EtcdTenantLog:
    """The HA tenant log: one etcd key per tenant, written by the leader only."""

    def __init__(self, election: LeaderElection) -> None:
        self.election = election
        self.writes = 0

    def load(self) -> dict[str, TenantQuota]:
        """The tenants the election read at its win (coord/election.py)."""
        records = dict(json_records(self.election.tenant_values,
                                    self.election.target.tenants_prefix, MAX_RECORD_BYTES,
                                    "tenant log"))
        return parse_records(records, "etcd")

    async def write(self, name: str, quota: TenantQuota) -> None:
        key = self.election.target.tenants_prefix + name
        value = json.dumps(fields_of(quota), sort_keys=True).encode()
        if not await self.election.write_as_leader({key: value}):
            raise ConnectionError("not the leader any more: the tenant was not written")
        self.writes += 1


__all__ = ["DISABLED", "EtcdTenantLog", "FileTenantLog", "default_path", "fields_of"]
