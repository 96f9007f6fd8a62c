"""Which master this process is (single, leader or standby) and the MasterService it serves.

Embedded default (no etcd): role "single", one MasterService for the life of the process.

High availability (`--etcd`): the process starts as a standby. `cellar.coord.election` calls
`on_elected(epoch)` when it wins; this builds a brand-new MasterService under that epoch, which
rebuilds its tables from the nodes' index reports exactly as after a master restart (nodes see
the new epoch and mount with `report_follows`). `on_deposed` throws the service away and puts
an empty one in its place: a deposed leader must never answer from metadata that a newer
leader may have changed since, so it forgets everything and becomes a standby.

`serving()` is the fence every RPC checks first: always true for "single"; for HA, true only
while the election says the lease is surely valid on this process's own monotonic clock. So a
leader frozen past its lease (SIGSTOP, a long pause) refuses the very first request it handles
after thawing, before its election loop even wakes up.

Takeover is measured from winning to the end of the recovering window (every reporting
segment done and the rebuild grace over) and logged with the number of objects adopted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cellar.coord.redirect import redirect_details
from cellar.errors import QuotaExceeded
from cellar.heap import release_frozen
from cellar.master.config import MasterConfig
from cellar.master.service import MasterService
from cellar.master.serving.events import (
    DEPOSED,
    ELECTED,
    NEW_LEADER,
    NODE_EXPIRED,
    REBUILD_DONE,
    EventLog,
)
from cellar.master.serving.removal_log import EtcdRemovalLog, FileRemovalLog
from cellar.master.serving.tenant_log import EtcdTenantLog, FileTenantLog
from cellar.master.serving.token_log import EtcdTokenLog
from cellar.master.state.tombstones import TombstoneRecord

if TYPE_CHECKING:
    from cellar.coord.election import LeaderElection
    from cellar.coord.target import LeaderRecord
    from cellar.master.state.records import Obj, Tenant, TenantQuota

log = logging.getLogger("cellar.master")

SINGLE = "single"
LEADER = "leader"
STANDBY = "standby"


class LeadershipLost(Exception):
    """A change's reply may not be sent: this master stopped leading before it could be."""


@dataclass(frozen=True, slots=True)
class DurableWork:
    """What one request's reply waits for (`Leadership.take_durable`)."""

    records: list[TombstoneRecord]  # removal bounds to write to the removal log
    settle_until: float             # the service clock's monotonic s (0: no wait)
    # versions the change dropped whose ranges wait for that write (state/objects.py), with
    # the service that holds them
    held: list[Obj] = field(default_factory=list)
    service: MasterService | None = None
    unwritten: list[TombstoneRecord] | None = None  # the earlier failed bounds it carries


@dataclass
class Takeover:
    """The last takeover: when it started, how long the rebuild took, what it recovered."""

    epoch: int = 0
    started_monotonic: float = 0.0
    duration_s: float = 0.0
    recovered_objects: int = 0
    nodes: int = 0
    complete: bool = False


# The calls whose reply acknowledges a remove or an upsert (the removal log's subject), or a
# revoke: its dead writes (state/tombstones.py) are bounds too, and a repeat answered from the
# reply memory must not be acknowledged before an earlier failed write of them went out.
REMOVING_METHODS = frozenset({"Remove", "RemovePrefix", "RemoveAll", "PutEnd", "PutRevoke"})


class Leadership:
    def __init__(self, config: MasterConfig, secret: bytes, *, ha: bool, master_id: str = "") -> None:
        self.config = config
        self._secret = secret
        self.ha = ha
        self.master_id = master_id
        self.election: LeaderElection | None = None
        self.leader: LeaderRecord | None = None  # the leader this master last saw (HA only)
        self.takeover = Takeover()
        self.elections_won = 0
        self.events = EventLog()
        self.service_started_monotonic = 0.0
        # what the expiry watch saw at the last tick (see _watch_expiries)
        self._watched: object = object()  # the service watched (identity only)
        self._expired_seen = 0
        self._node_replicas: dict[str, int] = {}
        self._single_rebuild_logged = False
        self.kv_events: Any = None  # the KvEventHub when --kv-events-bind is set (observe)
        self.service = self._new_service(None)
        self._published_nodes: frozenset[str] | None = None
        self._publishing: asyncio.Task[bool] | None = None
        # cellar.master.serving.removal_log: None only when turned off (removal_log_file = none)
        self.removal_log: FileRemovalLog | EtcdRemovalLog | None = None
        # cellar.master.serving.tenant_log: None when turned off (tenant_log_file = none)
        self.tenant_log: FileTenantLog | EtcdTenantLog | None = None
        # cellar.master.serving.token_log: HA masters only (a single master keeps its file)
        self.token_log: EtcdTokenLog | None = None
        self._setting_tenant: asyncio.Lock | None = None
        # Bounds whose write failed, with the service that made them (a takeover drops them),
        # and the versions whose ranges wait for them
        self._unwritten: tuple[MasterService | None, list[TombstoneRecord], list[Obj]] = \
            (None, [], [])

    def attach_removal_log(self, removal_log: FileRemovalLog | EtcdRemovalLog) -> None:
        """Use `removal_log`; a single master loads it now, before it serves anything (a
        leader loads it at each election, `on_elected`)."""
        self.removal_log = removal_log
        if isinstance(removal_log, FileRemovalLog):
            self.service.load_removals(removal_log.load())

    def attach_tenant_log(self, tenant_log: FileTenantLog | EtcdTenantLog) -> None:
        """Keep the tenants the admin API sets in `tenant_log`; a single master loads it now
        (a leader at each election, `on_elected`), before any report is adopted."""
        self.tenant_log = tenant_log
        if isinstance(tenant_log, FileTenantLog):
            self._load_tenants(tenant_log.load())

    def _load_tenants(self, quotas: dict[str, TenantQuota]) -> None:
        for name, quota in quotas.items():
            try:
                self.service.set_tenant_quota(name, quota)
            except QuotaExceeded as exc:  # max_tenants was lowered since: say so, go on
                log.warning("tenant log: %s", exc)

    async def set_tenant(self, name: str, quota: TenantQuota) -> Tenant:
        """Create a tenant or change its quotas (PUT /api/v1/tenants): written to the tenant
        log first, so the next master knows it too; raises (and changes nothing) if it cannot
        be, or past max_tenants."""
        if self._setting_tenant is None:  # made on the loop that uses it
            self._setting_tenant = asyncio.Lock()
        # one change at a time, written and applied in the same order: two PUTs of one
        # tenant in flight must not leave the log with one's quotas and memory with the other's,
        # and the file log rewrites its whole file (two at once would each lose the other's)
        async with self._setting_tenant:
            service = self.service
            service.tenants.check_room(name)
            if self.tenant_log is not None:
                await self.tenant_log.write(name, quota)
            if self.service is not service or not self.serving():
                raise LeadershipLost("lost the leadership while the tenant was written")
            return service.set_tenant_quota(name, quota)

    def durable_due(self, method: str) -> bool:
        """Whether the reply to a `method` call must wait for `make_durable`: the call queued
        bounds, or it is a mutating call while an earlier write failed (its repeat, answered
        from the reply memory, must not be acknowledged before those bounds are written)."""
        objects = self.service.objects
        if self.service.tombstones.pending or objects.read_trust.settle_until or objects.holding:
            return True
        return bool(self._unwritten[1]) and self._unwritten[0] is self.service \
            and method in REMOVING_METHODS

    def take_durable(self) -> DurableWork:
        """What the request just handled must wait for before its reply: the bounds it queued
        (state/tombstones.py) and until when clients may reuse what it changed
        (state/read_trust.py). Call right after `dispatch`, before anything else runs on the
        loop: the next request queues its own."""
        service = self.service
        records = service.tombstones.take_pending()
        held = service.objects.take_held()
        unwritten = None
        failed_service, failed_records, failed_held = self._unwritten
        if failed_service is service:
            unwritten = failed_records
            records = failed_records + records
            held = failed_held + held
        return DurableWork(records, service.objects.read_trust.take(), held, service, unwritten)

    def _keep_unwritten(self, service: MasterService, records: list[TombstoneRecord],
                        held: list[Obj]) -> None:
        """Keep a failed write's bounds and held versions beside those already kept (each
        once), the newest `max_remove_tombstones` bounds at most."""
        kept_service, kept_records, kept_held = self._unwritten
        if kept_service is not service:
            kept_records, kept_held = [], []
        seen = set(kept_records)
        merged = kept_records + [r for r in records if r not in seen]
        held_ids = {id(obj) for obj in kept_held}
        self._unwritten = (service, merged[-max(1, self.config.max_remove_tombstones):],
                           kept_held + [obj for obj in held if id(obj) not in held_ids])

    async def make_durable(self, work: DurableWork | None = None) -> None:
        """Write `work`'s bounds (default: `take_durable()` now) to the removal log, then wait
        out its read trust; the caller replies only once this returns (raises: not
        acknowledged)."""
        work = self.take_durable() if work is None else work
        records = work.records
        if records and self.removal_log is not None:
            try:
                await self.removal_log.append(records, self.service.tombstones.snapshot)
            except BaseException:
                # The change is in this master's memory though not acknowledged: keep its
                # bounds (at most `max_remove_tombstones`), so the next remove's or upsert's
                # write (its retry, or any other) makes them durable too; the ranges of what
                # it dropped stay on their nodes until then (state/objects.py). Added to what
                # earlier failures kept, never in place of it: two writes in flight at once
                # (the etcd log's group commit) carry disjoint bounds, and the one that
                # failed first would otherwise be forgotten while its retry is answered OK.
                if work.service is self.service:
                    self._keep_unwritten(work.service, records, work.held)
                raise
            if work.unwritten is not None and self._unwritten[1] is work.unwritten:
                # written with these: unless a later failure left newer ones (a superset)
                self._unwritten = (None, [], [])
        if work.held and work.service is not None:
            work.service.objects.release_held(work.held, work.service.clock.monotonic())
        # a client may still reuse the old version's replicas until then (read_trust.py); a
        # loop's timer may fire early by its resolution (uvloop's is 1 ms): sleep again then
        if not work.settle_until:
            return
        service, clock = self.service, self.service.clock
        while (wait_s := work.settle_until - clock.monotonic()) > 0:
            await asyncio.sleep(wait_s)
        if self.service is not service or not self.serving():
            # deposed while it waited: a new leader answers for the change now, not this one
            raise LeadershipLost("lost the leadership while the change waited out the read trust")

    def observe(self, observer: Any) -> None:
        """Attach the lifecycle observer (master/state/lifecycle.py) to this service and every
        service after it (a takeover replaces the service; the observer stays)."""
        self.kv_events = observer
        self.service.objects.observer = observer

    def _new_service(self, epoch: int | None) -> MasterService:
        self.service_started_monotonic = time.monotonic()  # its rebuild window opens now
        if not self.ha:
            service = MasterService(self.config, self._secret)
            service.role = SINGLE
        else:
            # A standby's service is never served; epoch 0 keeps its ids apart from any leader's.
            service = MasterService(self.config, self._secret, epoch=epoch if epoch is not None else 0)
            service.role = LEADER if epoch is not None else STANDBY
        service.objects.observer = self.kv_events if service.role != STANDBY else None
        # a remove's ranges wait for its bound in the removal log (make_durable frees them)
        service.objects.hold_until_durable = True
        return service

    # ---- what the servicer asks on every request ----------------------------------------

    def serving(self) -> bool:
        if not self.ha:
            return True
        election = self.election
        return election is not None and election.holds_lease()

    @property
    def role(self) -> str:
        """What this master is, as its status says: a leader past its lease answers as the
        standby it is about to be (the HTTP status and ClusterStatus both ask here), so no
        status reads "leader" while the master refuses every request; the election loop,
        which makes the change itself, may notice the lapse up to a keep-alive interval
        later."""
        role = self.service.role
        return STANDBY if role == LEADER and not self.serving() else role

    @property
    def epoch(self) -> int:
        """The epoch this master serves under, or (standby) the leader's it knows, or 0."""
        if not self.ha or self.service.role == LEADER:
            return self.service.epoch
        return self.leader.epoch if self.leader is not None else 0

    @property
    def leader_address(self) -> str:
        return self.leader.address if self.leader is not None else ""

    def redirect_address(self) -> str:
        """Where a non-serving master sends callers: the leader it knows, unless that is itself
        (a leader past its lease knows no successor yet), else ""."""
        leader = self.leader
        if leader is None or leader.master_id == self.master_id:
            return ""
        return leader.address

    def redirect(self) -> str:
        """The details of the UNAVAILABLE a non-serving master answers with."""
        leader = self.leader
        role = self.service.role
        return redirect_details(self.master_id, role if role != LEADER else "lease lapsed",
                                self.redirect_address(), leader.epoch if leader is not None else 0)

    def lease_remaining_s(self) -> float:
        return self.election.lease_remaining_s() if self.election is not None else 0.0

    # ---- callbacks from the election ----------------------------------------------------

    def on_elected(self, epoch: int) -> None:
        self.service = self._new_service(epoch)
        self.elections_won += 1
        self.takeover = Takeover(epoch=epoch, started_monotonic=time.monotonic())
        self._published_nodes = None
        expected = self.election.expected_nodes if self.election is not None else None
        if expected is not None:
            self.service.expect_nodes(expected)
        if isinstance(self.removal_log, EtcdRemovalLog):  # before any report is adopted
            self.service.load_removals(self.removal_log.load(epoch))
        if isinstance(self.tenant_log, EtcdTenantLog):  # so is a tenant the API created
            self._load_tenants(self.tenant_log.load())
        if self.token_log is not None:  # and its tokens, before any call is authenticated
            self.token_log.load()
        self.events.record(ELECTED, f"became leader with epoch {epoch}: rebuilding from the nodes' reports")
        log.info("took over as leader with epoch %d: rebuilding from the reports of %s", epoch,
                 f"{len(expected)} node(s)" if expected is not None else "the nodes (count unknown)")

    def on_deposed(self, reason: str) -> None:
        old = self.service
        self.service = self._new_service(None)
        self.events.record(DEPOSED, f"stepped down ({reason}); now a standby")
        log.warning("stepped down (%s): dropped the metadata of epoch %d (%d objects); now a standby",
                    reason, old.epoch, old.objects.complete_count)
        del old
        release_frozen()  # the dropped table is frozen and full of cycles (cellar.heap)

    def on_leader(self, record: LeaderRecord | None) -> None:
        old = self.leader
        if record is not None and (old is None or (old.master_id, old.epoch) != (record.master_id, record.epoch)):
            self.events.record(NEW_LEADER, f"leader is {record.master_id} at {record.address} (epoch {record.epoch})")
        self.leader = record

    # ---- background ----------------------------------------------------------------------

    def tick(self) -> None:
        """Close the takeover once the rebuild is over, then keep etcd's list of mounted nodes
        current for the next leader (called by the master's ticker)."""
        self._watch_expiries()
        takeover = self.takeover
        service = self.service
        if service.role == SINGLE:
            self._log_single_rebuild()
        if service.role != LEADER or takeover.epoch != service.epoch:
            return
        if takeover.complete:
            self._publish_nodes()
            return
        if service.recovering():
            return
        takeover.duration_s = time.monotonic() - takeover.started_monotonic
        takeover.recovered_objects = service.nodes.objects_adopted
        takeover.nodes = len(service.membership.nodes)
        takeover.complete = True
        self.events.record(REBUILD_DONE, f"rebuild done: {takeover.recovered_objects} objects from "
                           f"{takeover.nodes} node(s) in {takeover.duration_s:.3f} s")
        log.info("takeover complete: epoch %d, recovered %d objects from %d nodes in %.3f s",
                 takeover.epoch, takeover.recovered_objects, takeover.nodes, takeover.duration_s)

    def _log_single_rebuild(self) -> None:
        """A single master that restarted rebuilds from the nodes' reports too: log it once,
        when the rebuild window closes having adopted something (a fresh cluster adopts nothing)."""
        service = self.service
        if self._single_rebuild_logged or service.recovering():
            return
        self._single_rebuild_logged = True
        if service.nodes.objects_adopted:
            self.events.record(REBUILD_DONE, f"rebuild done: {service.nodes.objects_adopted} objects from "
                               f"{len(service.membership.nodes)} node(s) in "
                               f"{time.monotonic() - self.service_started_monotonic:.1f} s")

    def _watch_expiries(self) -> None:
        """Log each node the service expired since the last tick. The service's tick forgets an
        expired node and counts it (`nodes_expired`); the nodes that vanished from membership
        since the last look are those, with the replicas they held then. Observing here keeps
        the event log out of the metadata code. O(segments) per tick."""
        service = self.service
        nodes = service.membership.nodes
        if self._watched != service:  # a new service (election; identity, no __eq__): counter at 0
            self._watched, self._expired_seen = service, service.nodes.nodes_expired
        elif service.nodes.nodes_expired > self._expired_seen:
            gone = [node_id for node_id in self._node_replicas if node_id not in nodes]
            for node_id in gone[:service.nodes.nodes_expired - self._expired_seen]:
                self.events.record(NODE_EXPIRED, f"node {node_id} expired: its "
                                   f"{self._node_replicas[node_id]} replica(s) dropped")
            self._expired_seen = service.nodes.nodes_expired
        self._node_replicas = {node_id: sum(len(seg.objects) for seg in node.segments.values())
                               for node_id, node in nodes.items()}

    def _publish_nodes(self) -> None:
        """Write the mounted node ids to etcd when they changed, one write in flight at most.
        Only after the takeover completed: a list published mid-rebuild would be short, and a
        leader dying then would let the next one end its rebuild before every node reported."""
        election = self.election
        if election is None or (self._publishing is not None and not self._publishing.done()):
            return
        nodes = frozenset(self.service.membership.nodes)
        if nodes == self._published_nodes:
            return

        async def publish() -> bool:
            try:
                written = await election.publish_nodes(nodes)
            except Exception as exc:  # noqa: BLE001 - etcd trouble: the next tick tries again
                log.warning("could not record the mounted nodes in etcd: %s", exc)
                return False
            if written and self.service.epoch == self.takeover.epoch:
                self._published_nodes = nodes
            return written

        self._publishing = asyncio.get_running_loop().create_task(publish())

