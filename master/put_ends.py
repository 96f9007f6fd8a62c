"""PutEnd and PutRevoke: how a put ends, committed on the nodes' word or revoked.

Split out of `service.MasterService` (which binds these methods as its own, so
`service.put_end(...)` stays one call), like removals.py. What it owns: the rule that makes a
WRITING version COMPLETE: every replica comes with a node's write receipt of exactly its
allocation (master/receipts.py; without it the put is revoked and its ranges quarantined); a
remove acknowledged while the put was in flight wins (the put answers OK and stores nothing:
it is ordered just before the remove, master/removals.py); an upsert leaves a tombstone bound
below its first allocation, so no older value comes back. And what a PutEnd that finds no put
answers: OK for a repeat of one that completed (here, or under a master that died, proved by
its receipts), else why not. A PutEnd of a put-ahead allocation binds its key first
(master/put_ahead.py).

A PutEnd naming a put this master does not hold waits (UNAVAILABLE, retried by the client)
while the table is still being rebuilt. It is the retry of a put a dead master took, and the
version its receipts match may be only the first one reported: a later report can replace it
with an older value that a tier move or a repair copy gave a higher alloc id after a put-ahead
grant (rebuild keeps the newest id; only the dead master's PutEnd would have killed that
copy's range). Acknowledged from half a table, the put came back as its older value (the
disk soak, 2026-12-05: v5 acknowledged 78 ms after a restart, v3 read 6 s later). Once the
table is whole, the answer is the one every later rebuild gives too.

It reads and writes the service's tables on the one event loop, like every method of the
service; it never touches payload bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cellar.errors import Status
from cellar.master.grace import RebuildGrace
from cellar.master.put_ahead import PutAheads, is_ahead
from cellar.master.receipts import ReceiptChecker
from cellar.master.replies import KeyResults
from cellar.master.requests import Clock, PutEndLike, PutRefLike
from cellar.master.state.objects import ObjectTable
from cellar.master.state.records import HARD_PIN, Obj, Tenant
from cellar.master.state.tiers import Tiers
from cellar.master.state.tombstones import Tombstones

OK = Status.OK
INVALID = Status.INVALID


class MasterService(Protocol):
    """What a put's end reads of `cellar.master.service.MasterService` (no import: no cycle)."""

    clock: Clock
    grace: RebuildGrace
    objects: ObjectTable
    receipts: ReceiptChecker
    tombstones: Tombstones
    tiers: Tiers
    aheads: PutAheads

    def tenant(self, name: str, batch: int = ..., what: str = ...) -> Tenant: ...
    def recovering(self) -> bool: ...
    def key_error(self, key: str) -> str: ...
    def ranges_of(self, obj: Obj) -> list[int]: ...


class PutEnds:
    """PutEnd and PutRevoke over one `MasterService`'s tables."""

    def __init__(self, service: MasterService) -> None:
        self.service = service

    def put_end(self, tenant_name: str, client_id: str, items: Sequence[PutEndLike]) -> KeyResults:
        s = self.service
        tenant = s.tenant(tenant_name, len(items))  # checks the batch before it may create one
        now = s.clock.monotonic()
        puts = s.objects.puts
        if s.recovering() and any(item.put_id not in puts
                                  or _binds_a_missing_key(puts[item.put_id], tenant, item)
                                  for item in items):
            raise s.grace.error()  # before anything changes (the module docstring)
        results: KeyResults = []
        for item in items:
            obj = puts.get(item.put_id)
            if obj is not None and obj.tenant is tenant and is_ahead(obj):
                # a put-ahead allocation: bound to the item's key (checked there, as are its
                # receipts) whatever key the item names, its placeholder included
                refusal = s.aheads.bind(tenant, obj, item, now)
                if refusal is not None:
                    results.append(refusal)
                    continue
            elif obj is None or obj.tenant is not tenant or obj.key != item.key:
                results.append(self._miss(tenant, item))
                continue
            else:
                why = s.receipts.why_not(obj, item.checksum, item.receipts)
                if why:  # no node saw every byte: the put is revoked (its ranges quarantined)
                    s.objects.drop(obj, now)
                    results.append((Status.PERMISSION_DENIED, f"put revoked: {why}"))
                    continue
            first_alloc = min(rep.alloc_id for rep in obj.replicas)
            if first_alloc <= s.tombstones.removed_alloc_id(tenant.name, obj.key):
                s.objects.drop(obj, now)  # a remove acknowledged mid-put wins: the put is
                results.append((OK, ""))  # ordered before it (master/removals.py)
                continue
            old = tenant.objects.get(item.key)
            if old is not None:  # an upsert: every older value of the key is dead
                s.tombstones.remember_removed(tenant.name, obj.key, first_alloc - 1)
                # ...and so is every range the old value got after this one was placed (a
                # tier move's or a repair copy's target, done or not; none starts while a
                # PutStart's put is written, records.being_replaced, so only a put-ahead
                # allocation, granted before its key was known, meets one): its id is above
                # the bound, and a node that reports such a copy without its value's version
                # (journaled before the value id) would have a rebuilt master take it for the
                # newer value
                s.tombstones.kill_write(tenant.name, obj.key, s.ranges_of(old))
            s.objects.complete(obj, item.checksum, now)
            if obj.pin_kind == HARD_PIN:  # the next master pins it again (state/tombstones.py)
                s.tombstones.remember_hard_pin(tenant.name, obj.key, first_alloc)
            s.objects.read_trust.changed(tenant.name, obj.key, now, client_id)  # older versions
            s.tiers.on_complete(obj)
            obj.request = None  # only a WRITING object answers a repeated PutStart
            results.append((OK, ""))
        return results

    def _miss(self, tenant: Tenant, item: PutEndLike) -> tuple[int, str]:
        s = self.service
        key = item.key
        error = s.key_error(key)
        if error:
            return INVALID, error
        current = tenant.objects.get(key)
        if current is not None and current.put_id == item.put_id:
            return OK, ""  # a retried PutEnd whose first reply was lost
        if current is not None and s.receipts.wrote(current, item.checksum,
                                                    getattr(item, "receipts", ())):
            # the same, under a master that died: the receipts prove this caller wrote the
            # version a node reported. Acknowledged now, no later report may replace it
            s.objects.acked_by_receipt(current)
            return OK, ""
        if key in tenant.writing:
            return INVALID, "not the writer: put_id does not match the put in progress"
        if item.put_id in s.objects.expired_puts:
            return Status.EXPIRED, "the put was revoked after its writer timeout"
        return Status.NOT_FOUND, "key is not being written"

    def put_revoke(self, tenant_name: str, client_id: str, items: Sequence[PutRefLike]) -> KeyResults:
        s = self.service
        tenant = s.tenant(tenant_name, len(items))  # checks the batch before it may create one
        now = s.clock.monotonic()
        results: KeyResults = []
        for item in items:
            obj = s.objects.puts.get(item.put_id)
            if obj is None or obj.tenant is not tenant or obj.key != item.key and not (
                    item.key == "" and is_ahead(obj)):  # an unbound put-ahead is named ""
                error = s.key_error(item.key)
                if error:
                    results.append((INVALID, error))
                elif item.key in tenant.writing:
                    results.append((INVALID, "not the writer: put_id does not match the put in progress"))
                elif item.put_id in s.objects.expired_puts:
                    results.append((Status.EXPIRED, "the put was already revoked after its writer timeout"))
                else:
                    results.append((Status.NOT_FOUND, "key is not being written"))
                continue
            s.objects.drop(obj, now)
            results.append((OK, ""))
        return results


__all__ = ["PutEnds"]


def _binds_a_missing_key(obj: Obj, tenant: Tenant, item: PutEndLike) -> bool:
    """A put-ahead PutEnd that would bind, without upsert, a key missing from a table still
    being rebuilt (it may be a value not reported yet: put_starts.py refuses such a PutStart
    for the same reason)."""
    if not is_ahead(obj):
        return False
    bind = getattr(item, "bind", None)
    return not (bind is not None and bind.upsert) and item.key not in tenant.objects
