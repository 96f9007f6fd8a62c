"""The control loop: mount this node's segments on the master, heartbeat, follow the master.

States: UNMOUNTED -> (MountSegment ok) -> MOUNTED -> (Heartbeat every interval) -> ...
- A heartbeat reply carries freed ranges: they are applied to the index first and acknowledged
  (freed_ack_seq) in the next heartbeat, so the master never forgets a notice the node has not
  applied. Applying is idempotent, so a notice delivered twice does no harm.
- `remount=true`, a different master epoch, or a changed incarnation view sends the node back
  to UNMOUNTED; it mounts again at once.
- What a mount does with the index (the rebuild protocol):
  * first mount of this process (its index may have been restored from the journal), or a
    master with another epoch (it restarted, or a new leader): WRITING entries are dropped,
    the mount says `report_follows`, and the SEALED entries are sent with ReportObjects, per
    segment in batches of at most REPORT_BATCH_ENTRIES / REPORT_BATCH_BYTES, the last one
    flagged `last`. The master adopts them and places nothing new in a segment before its
    `last`. Entries it refuses (range taken, older version of a key) are dropped here.
  * the same master forgot this node (`remount=true` with an unchanged epoch: it expired us,
    e.g. after a stall): the master already dropped our replicas and told readers so, and
    may have seen removes since, so the index is cleared (entries become tombstones) and
    nothing is reported.
  Either way the mount reply's master time becomes the index's write floor: write grants
  issued before it are refused from now on (see index.py).
- Objects the verifier finds corrupt after a restart ride on the next heartbeat (`lost`).
- The master unreachable: the node keeps serving the data plane with the grants it can check
  (clock estimate runs on the local clock), retries at the heartbeat interval (mount attempts
  back off, bounded at MAX_BACKOFF_S) and logs each state change once, never per attempt.
- On clean shutdown it unmounts (bounded by a short deadline).

Every RPC carries RequestHeader(tenant="", client_id=node_id) and a deadline of
master_timeout_s. It never touches segment memory and never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.storage_node.clock import MasterClock, wall_ms
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment
from cellar.storage_node.verifier import Verifier

log = logging.getLogger("cellar.node.control")

INITIAL_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0
UNMOUNT_TIMEOUT_S = 2.0
REPORT_BATCH_ENTRIES = 2000
REPORT_BATCH_BYTES = 2 << 20  # well under the master's 4 MiB message limit
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


class MountRefused(Exception):
    """The master answered the mount but refused a segment."""


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
        verifier: Verifier | None = None,
    ) -> None:
        self.node_id = node_id
        self.host_id = host_id
        self.master = master
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
        self.freed_ack_seq = 0
        self.freed_applied = 0
        self.last_error = ""
        self.first_mount = asyncio.Event()
        self.verifier = verifier
        self.reported = 0          # entries reported in the last rebuild
        self.report_refused = 0    # of which the master refused
        self.lost_reported = 0
        self._report_next = True   # the next mount rebuilds the master from the index
        self._mounted_epoch = 0    # epoch of the last successful mount (0 = none yet)
        self._state = ""  # last logged state, so each change is logged once
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    # ---- lifecycle ---------------------------------------------------------------------

    def _header(self) -> pb.RequestHeader:
        return pb.RequestHeader(tenant="", client_id=self.node_id)

    def _ensure_channel(self) -> Any:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.master, options=CHANNEL_OPTIONS)
            self._stub = pb_grpc.MasterStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)
            self._channel = None
            self._stub = None

    async def run(self, stop: asyncio.Event) -> None:
        """Mount, then heartbeat until `stop` is set."""
        backoff = INITIAL_BACKOFF_S
        while not stop.is_set():
            if not self.mounted:
                if await self._try_mount():
                    backoff = INITIAL_BACKOFF_S
                    continue
                await _sleep_or_stop(stop, backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            await _sleep_or_stop(stop, self.heartbeat_interval_s)
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

    # ---- mount -------------------------------------------------------------------------

    def segment_infos(self) -> list[pb.SegmentInfo]:
        return [
            pb.SegmentInfo(
                segment_id=s.segment_id, node_id=self.node_id, size_bytes=s.size_bytes,
                host_id=self.host_id,
                endpoints=[
                    pb.Endpoint(transport="tcp", address=self.tcp_address),
                    pb.Endpoint(transport="shm", address=str(s.path) if s.path else ""),
                    *self.extra_endpoints.get(s.segment_id, []),
                ],
            )
            for s in self.segments
        ]

    async def _try_mount(self) -> bool:
        now_ms = self.clock.now_ms()
        if self._report_next:
            entries = self.index.prepare_report(now_ms)
        else:
            # The same master expired us: it dropped our replicas already (module docstring).
            self.index.clear(now_ms)
            entries = []
        self.freed_ack_seq = 0
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
            self.last_error = "mount refused: " + "; ".join(refused)
            self._log_state("refused", logging.ERROR, "master %s refused the mount: %s",
                            self.master, "; ".join(refused))
            return False
        old_epoch = self.clock.epoch
        if reply.header.epoch < old_epoch:
            log.warning("master epoch went back from %d to %d", old_epoch, reply.header.epoch)
        self.clock.epoch = reply.header.epoch
        self.index.set_mount(reply.header.master_time_ms, reply.write_grant_ttl_ms)
        if reply.heartbeat_interval_ms > 0:
            self.heartbeat_interval_s = reply.heartbeat_interval_ms / 1000.0
        if entries and not await self._report(entries):
            return False
        self._report_next = False
        self._mounted_epoch = reply.header.epoch
        self.mounted = True
        self.connected = True
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
        by_segment: dict[int, list[Any]] = {s.segment_id: [] for s in self.segments}
        for entry in entries:
            by_segment.setdefault(entry.segment_id, []).append(entry)
        refused: list[int] = []
        stub = self._ensure_channel()
        for segment_id, items in by_segment.items():
            start = 0
            while True:
                batch: list[pb.ReportedObject] = []
                size = 0
                while start < len(items) and len(batch) < REPORT_BATCH_ENTRIES and size < REPORT_BATCH_BYTES:
                    e = items[start]
                    start += 1
                    size += 64 + len(e.key) * 4 + len(e.tenant) * 4
                    batch.append(pb.ReportedObject(
                        tenant=e.tenant, key=e.key, alloc_id=e.alloc_id, offset=e.offset,
                        length=e.length, checksum=e.checksum, epoch=e.epoch))
                last = start >= len(items)
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
                if last:
                    break
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
            freed_ack_seq=self.freed_ack_seq,
        )
        lost = self.verifier.take_lost() if self.verifier is not None else []
        for segment_id, alloc_id, offset, length in lost:
            request.lost.add(segment_id=segment_id, alloc_id=alloc_id, offset=offset, length=length)
        sent = wall_ms()
        try:
            reply = await self._ensure_channel().Heartbeat(request, timeout=self.master_timeout_s)
        except grpc.aio.AioRpcError as exc:
            if lost and self.verifier is not None:
                self.verifier.requeue_lost(lost)
            self._rpc_failed(exc, waiting=False)
            return
        self.lost_reported += len(lost)
        self.clock.observe(reply.header.master_time_ms, sent, wall_ms())
        self.connected = True
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
        if reply.freed:
            self.freed_applied += self.index.apply_freed(reply.freed, self.clock.now_ms())
        if reply.freed_seq > self.freed_ack_seq:
            self.freed_ack_seq = reply.freed_seq
        self._log_state("mounted", logging.INFO, "master %s reachable again", self.master)

    def _rpc_failed(self, exc: grpc.aio.AioRpcError, *, waiting: bool) -> None:
        code = exc.code()
        self.connected = False
        self.last_error = f"{code.name}: {exc.details() or ''}".strip()
        if code in _UNREACHABLE:
            if waiting and self.mount_count == 0:
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
        return {
            "master": self.master,
            "connected": self.connected,
            "mounted": self.mounted,
            "mount_count": self.mount_count,
            "epoch": self.clock.epoch,
            "incarnation": self.incarnation,
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "freed_ack_seq": self.freed_ack_seq,
            "freed_applied": self.freed_applied,
            "reported": self.reported,
            "report_refused": self.report_refused,
            "lost_reported": self.lost_reported,
            "clock_offset_ms": self.clock.offset_ms,
            "last_error": self.last_error,
        }


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass
