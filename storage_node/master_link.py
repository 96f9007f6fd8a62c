"""The control loop: mount this node's segments on the master, heartbeat, follow the master.

Which master (issue 6, HA): `master` is either a fixed HOST:PORT or `etcd://H:P[,H:P]/CLUSTER`.
- etcd: the leader is looked up through `cellar.coord.discovery.LeaderDiscovery` (in a worker
  thread) at start and again whenever the master in use is unreachable (UNAVAILABLE,
  DEADLINE_EXCEEDED) or redirects; lookups are spaced at least MIN_LOOKUP_INTERVAL_S apart.
  etcd is the authority; when it is unreachable or names no leader (election under way) the
  node keeps trying the master it has (or the one a redirect named).
- Which master next is decided by `cellar.coord.link.node_target` (`next_master`), the policy the SDK uses
  too: etcd, when configured, is the authority (a redirect, UNAVAILABLE with trailing metadata
  `cellar-leader` or details ending in `leader=H:P`, is checked against it and followed only
  when etcd cannot say); without etcd a redirect is followed at once, and when the leader it
  named stays unreachable the node asks the configured address again. A
  redirect to the master just lost (a standby whose view has not caught up) is not followed
  for STALE_REDIRECT_S: it means an election is coming.
- While the leader may be changing, retries run at FAILOVER_POLL_S / FOLLOW_MAX_BACKOFF_S
  instead of the heartbeat interval / MAX_BACKOFF_S: the new leader's takeover waits for this
  node's report, so a late node delays every client.
- Another master address: the old channel is closed, one to the new address opened, and the
  node mounts again exactly as after a master restart (report_follows, previous_epoch = the
  last mounted epoch), so the new leader adopts this node's objects. Until that mount the
  old epoch stays the floor of the grants the node accepts; after it, older epochs are refused.
  A node the old master had expired (index about to be cleared) stays cleared: what a master
  dropped on purpose is never handed to its successor.

States: UNMOUNTED -> (MountSegment ok) -> MOUNTED -> (Heartbeat every interval) -> ...
- A heartbeat reply carries freed ranges: applied to the index first, acknowledged in the next
  heartbeat, which comes soon after (freed_acks.py).
- `remount=true`, a different master epoch, or a changed incarnation view sends the node back
  to UNMOUNTED; it mounts again at once.
- What a mount does with the index (the rebuild protocol):
  * first mount of this process (its index may have been restored from the journal), or a
    master with another epoch (it restarted, or a new leader): WRITING entries are dropped,
    the mount says `report_follows`, and the SEALED entries are sent with ReportObjects, per
    segment in batches of at most REPORT_BATCH_ENTRIES / REPORT_BATCH_BYTES (mount_report.py), the last one
    flagged `last`. The master adopts them and places nothing new in a segment before its
    `last`. Entries it refuses (range taken, older version of a key) are dropped here.
  * the same master forgot this node (`remount=true` with an unchanged epoch: it expired us,
    e.g. after a stall): the master already dropped our replicas and told readers so, and
    may have seen removes since, so the index is cleared (entries become tombstones) and
    nothing is reported.
  Either way the mount reply's master time becomes the index's write floor: write grants
  issued before it are refused from now on (see index.py).
- Objects the verifier finds corrupt after a restart (`lost`), the disk tier's finished moves
  (`moved`) and finished copies (`copied`) ride on the next heartbeat; its reply's `moves` and
  `copies` go to the mover and the copier (heartbeat_cargo.py).
- The master unreachable: the node keeps serving the data plane with the grants it can check
  (clock estimate runs on the local clock), retries at the heartbeat interval (mount attempts
  back off, bounded at MAX_BACKOFF_S) and logs each state change once, never per attempt.
- On clean shutdown it unmounts (bounded by a short deadline).

Every RPC carries RequestHeader(tenant="", client_id=node_id, token=<node credential>) and a
deadline of master_timeout_s. With `master_tls_cert_file` the node presents that client
certificate (CN node:<node id>) to the master's `node_listen` port instead, and the token is
empty (mutual TLS; the master's Authorizer takes the node id from the verified certificate). It never touches segment memory and never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from typing import Any, Protocol

import grpc
import grpc.aio

from cellar.coord.follow import NO_ETCD, EtcdView
from cellar.coord.link import LinkState, node_failure, node_target
from cellar.coord.redirect import leader_from
from cellar.coord.target import LeaderRecord, is_etcd_url, parse_etcd_url
from cellar.credentials import default_tls_ca
from cellar.errors import Unavailable
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.storage_node.clock import MasterClock, wall_ms
from cellar.storage_node.freed_acks import FreedAcks
from cellar.storage_node.heartbeat_cargo import HeartbeatCargo
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.mount_report import report_batches, segment_infos
from cellar.storage_node.segment import Segment
from cellar.tls import read_pem

log = logging.getLogger("cellar.node.control")

INITIAL_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0
UNMOUNT_TIMEOUT_S = 2.0
MIN_LOOKUP_INTERVAL_S = 0.25  # at most 4 etcd lookups a second per node
LOOKUP_TIMEOUT_S = 2.0
MIN_LOOKUP_TIMEOUT_S = 0.25  # a lookup's bound while a mounted master may still lead
FAILOVER_POLL_S = 0.25  # retry period while the leader may be changing (etcd or redirects)
FOLLOW_MAX_BACKOFF_S = 0.5  # mount retry bound when the leader may be changing
FOLLOW_HEARTBEAT_TIMEOUT_S = 1.0  # heartbeat deadline floor when the leader may be changing
MAX_MESSAGE_BYTES = 16 << 20  # freed-range batches are bounded by the master (~4096 ranges)
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED)
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly after a master restart; the default backoff grows to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", int(MAX_BACKOFF_S * 1000)),
    ("grpc.enable_retries", 0),
]


STATUS_FIELDS = (
    "master", "master_source", "configured_master", "leader_id", "leader_epoch",
    "master_changes", "connected", "mounted", "mount_count", "incarnation",
    "heartbeat_interval_s", "reported", "report_refused",
    "lost_reported", "last_error",
)


class MountRefused(Exception):
    """The master answered the mount but refused a segment."""


class LeaderSource(Protocol):
    """What the loop needs of `LeaderDiscovery` (tests pass a fake)."""

    def leader(self, timeout_s: float = ...) -> LeaderRecord | None: ...

    def close(self) -> None: ...


class ControlLoop:
    def __init__(
        self,
        *,
        node_id: str,
        host_id: str,
        master: str,
        segments: Sequence[Segment],
        tcp_address: str,
        index: ObjectIndex,
        clock: MasterClock,
        heartbeat_interval_s: float,
        master_timeout_s: float,
        incarnation: int | None = None,
        discovery: LeaderSource | None = None,
        credential: str = "",
        client_cert_file: str = "",
        client_key_file: str = "",
        cargo: HeartbeatCargo | None = None,
    ) -> None:
        self.node_id = node_id
        # The node credential (cellar.proto.grant.node_credential): every RPC's header token,
        # unless the node proves itself with a client certificate (mutual TLS): then it sends
        # none, so the credential never leaves the host.
        self._client_cert_file = client_cert_file
        self._client_key_file = client_key_file
        self._credential = "" if client_cert_file else credential
        self.host_id = host_id
        # `configured_master`: what the node was told (HOST:PORT or etcd://...); `master`: the
        # address it talks to now ("" until etcd named a leader).
        self.configured_master = master
        self._discovery: LeaderSource | None = None
        if is_etcd_url(master):
            self._discovery = discovery or _etcd_discovery(master)
        # which master, the last one lost, since when it fails: decided in cellar.coord.link
        self._link = LinkState("" if self._discovery else master, etcd=self._discovery is not None)
        self.master_source = "config"  # or the etcd url, or "redirect from H:P"
        self.leader_id = ""             # the leader's master id, when etcd named it
        self.leader_epoch = 0           # the epoch etcd published for it (0 = not from etcd)
        self.master_changes = 0
        self.segments = list(segments)
        self.tcp_address = tcp_address
        self.index = index
        self.clock = clock
        self.heartbeat_interval_s = heartbeat_interval_s
        self.master_timeout_s = master_timeout_s
        self.incarnation = incarnation or (secrets.randbits(64) or 1)
        # Endpoints other transports add (rdma: storage_node/rdma.py), by segment id.
        self.extra_endpoints: dict[int, list[pb.Endpoint]] = {}
        self.mounted = False
        self.connected = False
        self.mount_count = 0
        self.freed = FreedAcks()
        self.last_error = ""
        self.first_mount = asyncio.Event()
        self.cargo = cargo or HeartbeatCargo(None, None)  # lost replicas, tier moves
        self.reported = 0          # entries reported in the last rebuild
        self.report_refused = 0    # of which the master refused
        self.lost_reported = 0
        self._report_next = True   # the next mount rebuilds the master from the index
        self._mounted_epoch = 0    # epoch of the last successful mount (0 = none yet)
        self._state = ""  # last logged state, so each change is logged once
        self._resolve_due = self._discovery is not None  # look the leader up before the next RPC
        self._redirect = ""            # leader address the last refused RPC named
        self._redirected = False       # a redirect was followed since the last good mount
        self._next_lookup_at = 0.0     # loop time before which etcd is not asked again
        self._election = False         # the last refusal came from a standby naming no leader
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    @property
    def master(self) -> str:
        """The address the node talks to now ("" until etcd named a leader)."""
        return self._link.address

    def _succeeded(self) -> None:
        self._link.succeeded(self._link.generation)

    # ---- lifecycle ---------------------------------------------------------------------

    def _header(self) -> pb.RequestHeader:
        return pb.RequestHeader(tenant="", client_id=self.node_id, token=self._credential)

    def _ensure_channel(self) -> Any:
        if self._stub is None:
            ca = default_tls_ca(self.master)  # cellar.tls: $CELLAR_TLS_CA when the master speaks TLS
            mine = self._client_cert_file
            if ca or mine:  # a client certificate is TLS even without a CA (system roots then)
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=read_pem(ca) if ca else None,
                    private_key=read_pem(self._client_key_file) if mine else None,
                    certificate_chain=read_pem(mine) if mine else None)
                self._channel = grpc.aio.secure_channel(self.master, credentials, options=CHANNEL_OPTIONS)
            else:
                self._channel = grpc.aio.insecure_channel(self.master, options=CHANNEL_OPTIONS)
            self._stub = pb_grpc.MasterStub(self._channel)
        return self._stub

    async def _close_channel(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)
            self._channel = None
            self._stub = None

    async def close(self) -> None:
        await self._close_channel()
        if self._discovery is not None:
            # may wait for a lookup in flight (bounded by LOOKUP_TIMEOUT_S): not on the loop
            await asyncio.to_thread(self._discovery.close)

    async def run(self, stop: asyncio.Event) -> None:
        """Find the master, mount, then heartbeat until `stop` is set."""
        backoff = INITIAL_BACKOFF_S
        while not stop.is_set():
            if self._resolve_due or self._redirect or not self.master:
                await self._follow(stop)
                if not self.master:
                    await _sleep_or_stop(stop, backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
            if not self.mounted:
                redirected = self._redirected
                if await self._try_mount():
                    backoff = INITIAL_BACKOFF_S
                    continue
                if self._redirect and not redirected:
                    continue  # a redirect is an answer, not an outage: follow it at once
                if self._election:
                    # A standby answered and knows no leader: one is being elected; look
                    # again soon rather than backing off (the new leader waits for us).
                    backoff = min(backoff, FAILOVER_POLL_S)
                await _sleep_or_stop(stop, backoff)
                # While the leader may be changing, a slow retry only delays the takeover.
                backoff = min(backoff * 2,
                              FOLLOW_MAX_BACKOFF_S if self._following() else MAX_BACKOFF_S)
                continue
            interval_s = self.freed.next_interval_s(self.heartbeat_interval_s)
            if not self.connected and self._following():
                # The leader may be gone: look for its successor sooner than a heartbeat
                # (the new leader's rebuild waits for this node's report).
                interval_s = min(interval_s, FAILOVER_POLL_S)
            await _sleep_or_stop(stop, interval_s)
            if not stop.is_set():
                await self._try_heartbeat()
                self.index.purge(self.clock.now_ms())
                self.index.maybe_compact()

    async def unmount(self) -> None:
        """Best effort: tell the master these segments leave (clean shutdown)."""
        if not self.mounted:
            return
        request = pb.UnmountSegmentRequest(
            header=self._header(), node_id=self.node_id,
            segment_ids=[s.segment_id for s in self.segments],
        )
        try:
            await self._ensure_channel().UnmountSegment(
                request, timeout=min(self.master_timeout_s, UNMOUNT_TIMEOUT_S)
            )
            log.info("unmounted %d segment(s) from %s", len(self.segments), self.master)
        except grpc.aio.AioRpcError as exc:
            log.warning("unmount on %s failed: %s", self.master, exc.details() or exc.code().name)
        self.mounted = False

    # ---- which master ------------------------------------------------------------------

    def _heartbeat_timeout_s(self) -> float:
        """A stopped or cut-off leader is only noticed when a heartbeat times out; where a
        successor may exist, do not wait the full master_timeout_s for that."""
        if not self._following():
            return self.master_timeout_s
        # Connected: a heartbeat may wait two intervals. Lost already: one, so a successor
        # etcd names is looked up about once a heartbeat.
        intervals = 2 if self.connected else 1
        return min(self.master_timeout_s,
                   max(FOLLOW_HEARTBEAT_TIMEOUT_S, intervals * self.heartbeat_interval_s))

    def _following(self) -> bool:
        """Whether the master in use can change under us (etcd, or a redirect followed)."""
        return self._discovery is not None or self.master != self.configured_master

    async def _follow(self, stop: asyncio.Event) -> None:
        """Pick the master for the next RPC (after a failure, a redirect, or at start) with the
        policy every Cellar caller shares (`cellar.coord.link.node_target`)."""
        redirect, self._redirect = self._redirect, ""
        self._resolve_due = False
        record: LeaderRecord | None = None
        etcd = NO_ETCD
        if self._discovery is not None:
            record = await self._lookup(stop)
            etcd = EtcdView(configured=True, asked=True,
                            leader=record.address if record is not None else "")
        target = node_target(self._link, hint=redirect, etcd=etcd,
                             configured=self.configured_master,
                             now=asyncio.get_running_loop().time())
        if record is not None:
            self.leader_id, self.leader_epoch = record.master_id, record.epoch
        previous = self.master or "?"
        if not target:
            if record is not None and record.address == self.master:
                self.master_source = self.configured_master  # etcd confirmed where we are
            return
        if record is not None and target == record.address:
            await self._switch(target, self.configured_master)
            self.leader_id, self.leader_epoch = record.master_id, record.epoch
            log.info("following leader %s at %s (epoch %d)", record.master_id, target,
                     record.epoch)
        elif target == redirect:
            self._redirected = True
            await self._switch(target, f"redirect from {previous}")
            log.info("following leader at %s (redirected by %s)", target, previous)
        else:
            # The leader a redirect named is gone: the configured master knows the next one.
            log.info("master %s unreachable: asking %s again", previous, target)
            await self._switch(target, "config" if target == self.configured_master else target)

    async def _lookup(self, stop: asyncio.Event) -> LeaderRecord | None:
        """The leader etcd names, or None (no leader now, or etcd unreachable: logged once)."""
        assert self._discovery is not None
        loop = asyncio.get_running_loop()
        wait_s = self._next_lookup_at - loop.time()
        if wait_s > 0:
            await _sleep_or_stop(stop, wait_s)
            if stop.is_set():
                return None
        timeout_s = min(LOOKUP_TIMEOUT_S, self.master_timeout_s)
        if self.mounted and self.master:
            # The master in use may lead still (a moment unsure of its lease, a heartbeat that
            # timed out while etcd was away): a lookup of an etcd that does not answer must
            # not stop the heartbeats to it for longer than one, or it finds this node
            # SUSPECT once it serves again and refuses puts for want of live nodes.
            timeout_s = min(timeout_s, max(MIN_LOOKUP_TIMEOUT_S, self.heartbeat_interval_s))
        try:
            record = await asyncio.to_thread(self._discovery.leader, timeout_s)
        except Unavailable as exc:
            self.last_error = str(exc)
            self._log_state("etcd unreachable", logging.WARNING,
                            "%s; keeping master %s", exc, self.master or "(none yet)")
            return None
        except Exception as exc:  # a broken etcd client must not end the control loop
            self.last_error = f"leader lookup failed: {exc!r}"
            self._log_state("lookup failed", logging.ERROR, "leader lookup in %s failed: %r",
                            self.configured_master, exc)
            return None
        finally:
            self._next_lookup_at = loop.time() + MIN_LOOKUP_INTERVAL_S
        if record is None:
            self._log_state("no leader", logging.WARNING,
                            "etcd names no leader for %s (election under way); retrying",
                            self.configured_master)
        return record

    async def _switch(self, address: str, source: str) -> None:
        """Talk to `address` from now on and mount there as after a master restart."""
        if address == self.master:
            self.master_source = source
            return
        previous = self.master
        await self._close_channel()
        self._link.switched(address)
        self.master_source = source
        self.leader_id, self.leader_epoch = "", 0
        self.master_changes += 1
        if previous:
            # Rebuild the new master from the index, unless the old one expired this node
            # (mount pending with a clean index): what it dropped stays dropped.
            self._report_next = self._report_next or self.mounted
            self.mounted = False
        self._state = ""  # the next state is news about another master

    # ---- mount -------------------------------------------------------------------------

    def segment_infos(self) -> list[pb.SegmentInfo]:
        return segment_infos(self.segments, self.node_id, self.host_id, self.tcp_address,
                             self.extra_endpoints)

    async def _try_mount(self) -> bool:
        if not await self.cargo.begin_mount():  # before the index is reported
            self.last_error = "a tier move or copy of an earlier mount is still writing"
            return False
        now_ms = self.clock.now_ms()
        if self._report_next:
            entries = self.index.prepare_report(now_ms)
        else:
            # The same master expired us: it dropped our replicas already (module docstring).
            self.index.clear(now_ms)
            entries = []
        self.freed.reset()
        request = pb.MountSegmentRequest(
            header=self._header(), node_id=self.node_id, incarnation=self.incarnation,
            segments=self.segment_infos(), report_follows=bool(entries),
            previous_epoch=self._mounted_epoch,
        )
        sent = wall_ms()
        try:
            reply = await self._ensure_channel().MountSegment(request, timeout=self.master_timeout_s)
        except grpc.aio.AioRpcError as exc:
            self._rpc_failed(exc, waiting=True)
            return False
        self.clock.observe(reply.header.master_time_ms, sent, wall_ms())
        refused = [
            f"segment {s.segment_id}: {r.message or pb.Status.Name(r.status)}"
            for s, r in zip(self.segments, reply.results, strict=False)
            if r.status != pb.OK
        ]
        if len(reply.results) != len(self.segments):
            refused.append(f"{len(reply.results)} results for {len(self.segments)} segments")
        if refused:
            self.connected = True
            self._succeeded()
            self.last_error = "mount refused: " + "; ".join(refused)
            self._log_state("refused", logging.ERROR, "master %s refused the mount: %s",
                            self.master, "; ".join(refused))
            return False
        old_epoch = self.clock.epoch
        if reply.header.epoch < old_epoch:
            log.warning("master epoch went back from %d to %d", old_epoch, reply.header.epoch)
        self.clock.epoch = reply.header.epoch
        self.index.set_mount(reply.header.master_time_ms, reply.write_grant_ttl_ms,
                             reply.read_grant_ttl_ms)
        if reply.heartbeat_interval_ms > 0:
            self.heartbeat_interval_s = reply.heartbeat_interval_ms / 1000.0
        if entries and not await self._report(entries):
            return False
        self._report_next = False
        self._redirected = False
        self._mounted_epoch = reply.header.epoch
        self.mounted = True
        self.connected = True
        self._succeeded()
        self.mount_count += 1
        self.last_error = ""
        self._log_state(
            "mounted", logging.INFO,
            "%s %d segment(s) on %s (epoch %d, heartbeat every %.3gs)",
            "mounted" if self.mount_count == 1 else "re-mounted", len(self.segments),
            self.master, self.clock.epoch, self.heartbeat_interval_s,
        )
        self.first_mount.set()
        return True

    async def _report(self, entries: list[Any]) -> bool:
        """Send the index to the master, segment by segment; False if it must mount again."""
        refused: list[int] = []
        stub = self._ensure_channel()
        for segment_id, batch, last in report_batches(entries, [s.segment_id for s in self.segments]):
            request = pb.ReportObjectsRequest(
                header=self._header(), node_id=self.node_id, incarnation=self.incarnation,
                segment_id=segment_id, entries=batch, last=last)
            try:
                reply = await stub.ReportObjects(request, timeout=self.master_timeout_s)
            except grpc.aio.AioRpcError as exc:
                self._rpc_failed(exc, waiting=False)
                return False
            if reply.status != pb.OK:
                self.last_error = f"report refused: {reply.message}"
                self._log_state("report refused", logging.WARNING,
                                "master %s refused the index report: %s", self.master,
                                reply.message)
                return False
            refused.extend(reply.refused_alloc_ids)
        dropped = self.index.drop_alloc_ids(refused)
        self.reported = len(entries)
        self.report_refused = dropped
        log.info("reported %d object(s) to master %s; it refused %d", len(entries), self.master,
                 len(refused))
        return True

    # ---- heartbeat ---------------------------------------------------------------------

    async def _try_heartbeat(self) -> None:
        request = pb.HeartbeatRequest(
            header=self._header(), node_id=self.node_id, incarnation=self.incarnation,
            freed_ack_seq=self.freed.ack_seq,
        )
        load = self.cargo.load(request)
        sent = wall_ms()
        try:
            reply = await self._ensure_channel().Heartbeat(request, timeout=self._heartbeat_timeout_s())
        except grpc.aio.AioRpcError as exc:
            self.cargo.undelivered(load)
            self._rpc_failed(exc, waiting=False)
            return
        self.lost_reported += len(load.lost)
        self.clock.observe(reply.header.master_time_ms, sent, wall_ms())
        self.connected = True
        self._succeeded()
        if reply.remount:
            self.mounted = False
            # A master with another epoch starts empty: rebuild it. The same master forgot us
            # on purpose (expiry): start clean (module docstring).
            self._report_next = reply.header.epoch != self.clock.epoch
            self._log_state("remount", logging.WARNING,
                            "master %s does not know this node (restarted or expired it): "
                            "mounting again", self.master)
            return
        if reply.header.epoch != self.clock.epoch:
            self.mounted = False
            self._report_next = True
            self._log_state("remount", logging.WARNING,
                            "master epoch changed from %d to %d: mounting again",
                            self.clock.epoch, reply.header.epoch)
            return
        self.freed.take(reply, self.index, self.clock.now_ms())
        self.cargo.unload(reply, load)  # after the freed ranges its moves may reuse
        if reply.engine_hashes:  # for the next report: a rebuilt master knows them
            self.index.set_engine_hashes(reply.engine_hashes)
        if reply.soft_pins:  # the same: a rebuilt master soft-pins them again
            self.index.set_soft_pins(reply.soft_pins)
        self._log_state("mounted", logging.INFO, "master %s reachable again", self.master)

    def _rpc_failed(self, exc: grpc.aio.AioRpcError, *, waiting: bool) -> None:
        code = exc.code()
        self.connected = False
        self.last_error = f"{code.name}: {exc.details() or ''}".strip()
        details = exc.details() or ""
        unavailable = code == grpc.StatusCode.UNAVAILABLE
        failure = node_failure(
            self._link, unavailable=unavailable, unreachable=code in _UNREACHABLE,
            details=details, now=asyncio.get_running_loop().time(),
            hint=leader_from(exc.trailing_metadata(), details) if unavailable else "")
        self._election = failure.election
        if failure.redirect:
            self._redirect = failure.redirect
            self._log_state(f"redirect {failure.redirect}", logging.INFO,
                            "master %s is not the leader; it names %s", self.master,
                            failure.redirect)
            return
        if failure.unreachable:
            # With etcd, ask it who leads now; with a fixed address, `_follow` decides whether
            # to go back to the configured master.
            self._resolve_due = self._following()
            if self._election:
                self._log_state("election", logging.WARNING,
                                "master %s does not lead and knows no leader yet; retrying",
                                self.master)
            elif waiting and self.mount_count == 0:
                self._log_state("waiting", logging.WARNING,
                                "waiting for master %s (unreachable); retrying", self.master)
            else:
                self._log_state("unreachable", logging.WARNING,
                                "master %s unreachable (%s); retrying", self.master, code.name)
        else:
            self._log_state(f"error {code.name}", logging.ERROR,
                            "master %s rejected %s: %s", self.master,
                            "MountSegment" if waiting else "Heartbeat", self.last_error)

    def _log_state(self, state: str, level: int, message: str, *args: object) -> None:
        if state != self._state:
            self._state = state
            log.log(level, message, *args)

    def status(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in STATUS_FIELDS}
        out.update(epoch=self.clock.epoch, clock_offset_ms=self.clock.offset_ms,
                   freed_ack_seq=self.freed.ack_seq, freed_applied=self.freed.applied)
        return out


def _etcd_discovery(url: str) -> LeaderSource:
    # Imported here: a node with a fixed master address never loads the etcd client.
    from cellar.coord.discovery import LeaderDiscovery

    return LeaderDiscovery(parse_etcd_url(url))


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass
