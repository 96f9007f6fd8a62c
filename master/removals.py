"""Removals: Remove, RemovePrefix and RemoveAll, and the removal log's bounds.

Split out of `service.MasterService` (which binds these methods as its own, so
`service.remove(...)` stays one call). What it owns: the rule of a client's removal. A removed
value is dropped and its key tombstoned with the newest allocation id issued so far (except a
put of the key still in flight), so that a node's late index report cannot bring it back; a
remove of a key the master does not hold tombstones it too (a node that is away may still hold
a value). The tombstones are queued for the serving room's removal log, and the servicer
acknowledges the call only once they are durable.

It reads and writes the service's tables (objects, tombstones, alloc ids) on the one event
loop, like every method of the service; it never touches payload bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cellar.errors import Status
from cellar.master.config import MasterConfig
from cellar.master.grace import RebuildGrace
from cellar.master.replies import KeyResults
from cellar.master.requests import Clock, RequestRejected, check_key_bound
from cellar.master.state.ids import AllocIds
from cellar.master.state.objects import ObjectTable
from cellar.master.state.records import Obj, Tenant
from cellar.master.state.tombstones import TombstoneRecord, Tombstones

OK = Status.OK


class MasterService(Protocol):
    """What removal reads of `cellar.master.service.MasterService` (no import: no cycle)."""

    config: MasterConfig
    clock: Clock
    grace: RebuildGrace
    objects: ObjectTable
    tombstones: Tombstones
    alloc_ids: AllocIds

    def tenant(self, name: str, batch: int = ..., what: str = ...) -> Tenant: ...
    def recovering(self) -> bool: ...
    def miss(self, tenant: Tenant, key: str) -> tuple[Status, str]: ...


class Removals:
    """The removal RPCs over one `MasterService`'s tables."""

    def __init__(self, service: MasterService) -> None:
        self.service = service

    def remove(self, tenant_name: str, keys: Sequence[str], by: str = "",
               client_id: str = "") -> KeyResults:
        """`by`: the request's tag (serving/request_memory.request_tag), '' without a request
        id. It rides with the bounds into the durable removal log, so that after a failover
        the new master answers this call's repeat (its first reply lost with the old master)
        OK for a key the call removed, as the first call answered, not NOT_FOUND."""
        s = self.service
        tenant = s.tenant(tenant_name, len(keys))  # checks the batch before it may create one
        now = s.clock.monotonic()
        if s.recovering() and any(key not in tenant.objects for key in keys):
            raise s.grace.error()
        results: KeyResults = []
        for key in keys:
            obj = tenant.objects.get(key)
            if obj is None:
                status, message = s.miss(tenant, key)
                if status == Status.NOT_READY:
                    message = "key is being written; its writer must revoke it"
                elif status == Status.NOT_FOUND:
                    repeat = s.tombstones.removed_by_request(tenant.name, key, by)
                    if repeat:  # this call's repeat: the first one removed the key
                        status, message = OK, ""
                    # a node that is away may still hold a value; the tag names only a call
                    # that removed something, so a repeat of a miss still misses
                    self._tombstone(tenant, key, by if repeat else "")
                    # a version evicted moments ago may still be read where it was
                    s.objects.read_trust.changed(tenant.name, key, now, client_id)
                results.append((status, message))
                continue
            self._remove(obj, now, by, client_id)
            results.append((OK, ""))
        return results

    def _remove(self, obj: Obj, now: float, by: str = "", client_id: str = "") -> None:
        """Drop a value a client removed, remembering it so a late report cannot revive it;
        the reply waits until no other client may reuse it (state/read_trust.py), and its
        nodes keep its bytes until the removal log holds the remove (state/objects.py)."""
        s = self.service
        self._tombstone(obj.tenant, obj.key, by)
        s.objects.drop(obj, now, until_durable=True)  # its ranges wait for the removal log
        s.objects.read_trust.changed(obj.tenant.name, obj.key, now, client_id)

    def _tombstone(self, tenant: Tenant, key: str, by: str = "") -> None:
        """Every allocation of the key issued so far is dead, a put of it still in flight
        included (state/tombstones.py); queued for the removal log. Such a put's PutEnd then
        answers OK and drops it (put_ends.py): the put is ordered just before this remove,
        which its client saw acknowledged first. Sparing it instead let a put whose writer had
        given up (its bytes sealed on a node, no PutEnd ever) come back after a master restart,
        over an acknowledged remove (make soak: 3 keys in 10 minutes)."""
        s = self.service
        s.tombstones.remember_removed(tenant.name, key, s.alloc_ids.next(), by)

    def load_removals(self, records: list[TombstoneRecord]) -> None:
        """The removal log's bounds, before any report is adopted (master/serving/removal_log.py)."""
        s = self.service
        highest = s.tombstones.load(records)
        if highest:
            s.alloc_ids.ensure_above(highest)

    def removed_alloc_id(self, tenant_name: str, key: str) -> int:
        """The alloc id drawn when the key was last removed (0: none remembered)."""
        s = self.service
        return s.tombstones.removed_alloc_id(tenant_name, key)

    def remove_prefix(self, tenant_name: str, prefix: str, client_id: str = "") -> int:
        s = self.service
        tenant = s.tenant(tenant_name)
        if s.recovering():
            raise s.grace.error()
        if not prefix:
            raise RequestRejected("empty prefix (use RemoveAll to remove every key)")
        check_key_bound("prefix", prefix, s.config.max_key_bytes)
        victims = [obj for key, obj in tenant.objects.items() if key.startswith(prefix)]
        return self._drop_all(victims, client_id, tenant.name, prefix)

    def remove_all(self, tenant_name: str, client_id: str = "") -> int:
        s = self.service
        tenant = s.tenant(tenant_name)
        if s.recovering():
            raise s.grace.error()
        return self._drop_all(list(tenant.objects.values()), client_id, tenant.name, "")

    def _drop_all(self, victims: list[Obj], client_id: str, tenant_name: str,
                  prefix: str) -> int:
        s = self.service
        now = s.clock.monotonic()
        for obj in victims:
            self._remove(obj, now, client_id=client_id)
        # keys under the prefix evicted moments ago: not dropped here, maybe still read
        s.objects.read_trust.changed_prefix(tenant_name, prefix, now, client_id)
        return len(victims)


__all__ = ["Removals"]
