"""StorageNode: one node process's parts, wired together, and their start/stop order.

Start: segments (mapped memory; an earlier process's files of the same size are re-attached)
-> index journal replayed into the index (entries of re-attached segments only) -> verifier
thread (re-checks restored checksums at a bounded rate) -> NodeAccess -> TCP data server (over TLS with a certificate, advertised as tls://) ->
optional HTTP -> control loop (mount, report the index, then heartbeats). Until its first
mount the node admits no write (grants from before a restart must not land). The node is "ready" once its first
mount succeeded: only then can clients be handed grants for it.
Stop (reverse): control loop stops and unmounts (so the master stops placing here) -> HTTP ->
data server (connections closed, threads joined) -> segments unmapped and their files (and
the journal) unlinked unless `keep_segments_on_exit`. A crash leaves both behind, which is what
a restart with the same `--node-id` re-attaches.

It owns no policy of its own; each rule lives in the module named for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

from cellar.credentials import default_tls_ca
from cellar.heap import freeze_survivors
from cellar.http import HttpServer
from cellar.http_fetch import advertised
from cellar.proto.grant import node_credential
from cellar.proto.tiers import TIER_DRAM
from cellar.refusals import RefusalLog
from cellar.storage_node.access import NodeAccess
from cellar.storage_node.clock import MasterClock
from cellar.storage_node.config import NodeConfig
from cellar.storage_node.copier import Copier
from cellar.storage_node.disk_tier import TierMover, open_disk_segment
from cellar.storage_node.heartbeat_cargo import HeartbeatCargo
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.journal import IndexJournal, journal_path
from cellar.storage_node.master_link import ControlLoop
from cellar.storage_node.metrics import NodeCollector, build_http, build_registry
from cellar.storage_node.rdma import NodeRdma
from cellar.storage_node.rdma import attach as attach_rdma
from cellar.storage_node.segment import Segment
from cellar.storage_node.verifier import Verifier
from cellar.transfer.tcp_server import TcpDataServer
from cellar.transfer.tls_sock import server_context, tls_endpoint
from cellar.units import WILDCARD_HOSTS, format_size

log = logging.getLogger("cellar.node")

HEAP_FREEZE_INTERVAL_S = 1.0


async def _freeze_heap_every(interval_s: float) -> None:
    """Keep the cyclic GC from rescanning the whole object index (cellar.heap): an entry per
    object in the segments, up to millions; measured ~15 us per object admitted at 2*10^5
    entries without this, against 3 us with the collector off."""
    while True:
        await asyncio.sleep(interval_s)
        freeze_survivors()


class StorageNode:
    def __init__(self, cfg: NodeConfig, secret: bytes) -> None:
        self.cfg = cfg
        self.secret = secret
        self.segments: list[Segment] = []
        self.index = ObjectIndex(allowed_skew_ms=int(cfg.grant_skew_s * 1000))
        self.journal: IndexJournal | None = None
        self.verifier: Verifier | None = None
        self.restored = 0
        self.clock = MasterClock()
        self.access: NodeAccess | None = None
        self.server: TcpDataServer | None = None
        self.control: ControlLoop | None = None
        self.rdma: NodeRdma | None = None
        self.mover: TierMover | None = None  # the disk tier's moves (None without a disk tier)
        self.http: HttpServer | None = None
        self.tcp_address = ""
        self.http_address = ""

    # ---- start -------------------------------------------------------------------------

    def open(self) -> None:
        """Create the segments and start the data server (raises SegmentError / OSError)."""
        cfg = self.cfg
        try:
            for i in range(cfg.segments):
                self.segments.append(Segment.create(
                    cfg.shm_dir, cfg.node_id, i, cfg.segment_size_bytes,
                    hugepages=cfg.hugepages, mlock=cfg.mlock,
                ))
            if cfg.disk_dir:
                self.segments.append(open_disk_segment(cfg.disk_dir, cfg.node_id,
                                                       cfg.disk_size_bytes))
            by_id = {s.segment_id: s for s in self.segments}
            assert len(by_id) == len(self.segments), "segment id collision"
            self._restore_index(by_id)
            if cfg.disk_dir:
                self.mover = TierMover(by_id, self.index)
                self.mover.start()
            self.access = NodeAccess(by_id, self.index, self.secret, self.clock,
                                     allowed_skew_ms=int(cfg.grant_skew_s * 1000))
            host, port = cfg.listen_host_port
            self.server = TcpDataServer(self.access, host, port,
                                        max_frame_payload_bytes=cfg.max_frame_payload_bytes,
                                        max_connections=cfg.max_connections,
                                        max_connections_per_peer=cfg.max_connections_per_peer,
                                        idle_timeout_s=cfg.idle_timeout_s,
                                        frame_timeout_s=cfg.frame_timeout_s,
                                        spin_us=cfg.data_spin_us,
                                        ssl_context=self._tls_context(),
                                        auth_timeout_s=cfg.auth_timeout_s,
                                        unauthenticated_backoff_s=(
                                            cfg.unauthenticated_backoff_s),
                                        on_refusal=RefusalLog(log, "data port", interval_s=(
                                            cfg.refusal_log_interval_s)).note)
            port = self.server.start()
        except BaseException:
            self.close()
            raise
        advertised = cfg.advertised_host(host)
        self.tcp_address = f"[{advertised}]:{port}" if ":" in advertised else f"{advertised}:{port}"
        if cfg.tls_cert_file:  # clients must know to speak TLS, and never fall back (tls_sock)
            self.tcp_address = tls_endpoint(self.tcp_address)
        self.control = ControlLoop(
            node_id=cfg.node_id, host_id=cfg.host_id, master=cfg.master, segments=self.segments,
            tcp_address=self.tcp_address, index=self.index, clock=self.clock,
            heartbeat_interval_s=cfg.heartbeat_interval_s, master_timeout_s=cfg.master_timeout_s,
            credential=node_credential(self.secret, cfg.node_id),
            client_cert_file=cfg.master_tls_cert_file, client_key_file=cfg.master_tls_key_file,
            cargo=HeartbeatCargo(self.verifier, self.mover,
                                 Copier(self.access, tls_ca_file=default_tls_ca(cfg.master))),
        )
        # Serve rdma too where this machine has a device; None (one log line) otherwise.
        self.rdma = attach_rdma(self.segments, self.access, self.control)

    def _tls_context(self) -> ssl.SSLContext | None:
        """The data port's TLS context when the node has a certificate (tls_sock); the HTTP
        port's too with http_tls."""
        cfg = self.cfg
        if not cfg.tls_cert_file:
            return None
        return server_context(cfg.tls_cert_file, cfg.tls_key_file)

    def _restore_index(self, by_id: dict[int, Segment]) -> None:
        cfg = self.cfg
        path = journal_path(cfg.journal_directory, cfg.node_id)
        try:
            journal, entries = IndexJournal.open(path)
        except OSError as exc:
            log.error("cannot use the index journal %s (%s): objects will not survive a restart "
                      "of this node", path, exc.strerror or exc)
            journal, entries = None, []
        self.journal = journal
        # Journal appends of seals wait for the data server's flush before its replies
        # (NodeAccess.flush): one write per batch of replies, not one per object.
        self.index = ObjectIndex(allowed_skew_ms=int(cfg.grant_skew_s * 1000), journal=journal,
                                 defer_journal=True)
        self.index.refuse_writes_until_mount()
        sizes = {sid: s.size_bytes for sid, s in by_id.items() if s.reattached}
        restored = self.index.restore(entries, sizes)
        self.restored = len(restored)
        if entries:
            log.info("restored %d of %d journaled object(s); verifying their bytes at %s/s",
                     len(restored), len(entries), format_size(cfg.verify_rate_bytes_per_s))
        self.verifier = Verifier(by_id, self.index, restored,
                                 rate_bytes_per_s=cfg.verify_rate_bytes_per_s)
        self.verifier.start()

    async def run(self, stop: asyncio.Event, on_ready: Callable[[], None] | None = None) -> None:
        """Serve until `stop` is set; call `on_ready` once the first mount succeeded."""
        assert self.control is not None and self.server is not None, "open() first"
        control = self.control
        if self.cfg.http_host_port is not None:
            host, port = self.cfg.http_host_port
            collector = NodeCollector({s.segment_id: s for s in self.segments}, self.index,
                                      self.server.stats.snapshot, lambda: control.connected)
            registry = build_registry(collector)
            self.http = build_http(registry, self.status, lambda: control.mount_count > 0)
            self.http.set_limits(max_connections=self.cfg.http_max_connections,
                                 max_connections_per_peer=self.cfg.http_max_connections_per_peer,
                                 header_timeout_s=self.cfg.http_header_timeout_s,
                                 refusal_log_interval_s=self.cfg.refusal_log_interval_s)
            registry.register(self.http.collector("node"))
            # the data port's certificate and context (http_tls needs tls_cert_file)
            port = await self.http.start(host, port,
                                         self._tls_context() if self.cfg.http_tls else None)
            # a wildcard listen is named by the advertised host (the data port's), which
            # others reach and a TLS certificate covers
            named = self.cfg.advertised_host(host) if host in WILDCARD_HOSTS else host
            self.http_address = advertised(named, port, self.cfg.http_tls)
        task = asyncio.create_task(control.run(stop), name="cellar-node-control")
        freezer = asyncio.create_task(_freeze_heap_every(HEAP_FREEZE_INTERVAL_S),
                                      name="cellar-node-gc-freeze")
        try:
            mounted = asyncio.create_task(control.first_mount.wait())
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({mounted, stopped, task}, return_when=asyncio.FIRST_COMPLETED)
            mounted.cancel()
            stopped.cancel()
            if control.first_mount.is_set() and on_ready is not None:
                on_ready()
            await stop.wait()
        finally:
            freezer.cancel()
            if not task.done():
                stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await control.unmount()
            await control.close()
            await control.cargo.aclose()
            if self.http is not None:
                await self.http.stop()

    # ---- stop --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the data server and release the segments. Safe to call twice."""
        if self.verifier is not None:
            self.verifier.stop()
        if self.mover is not None:
            self.mover.stop()
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.rdma is not None:
            self.rdma.close()
            self.rdma = None
        keep = self.cfg.keep_segments_on_exit
        for segment in self.segments:  # the disk tier's file outlives every stop
            segment.close(unlink=not keep and segment.tier == TIER_DRAM)
        self.segments = []
        if self.journal is not None:  # ... and so does the journal that describes it
            self.journal.close(unlink=not keep and not self.cfg.disk_dir)
            self.journal = None

    # ---- views -------------------------------------------------------------------------

    def ready_line(self) -> str:
        cfg = self.cfg
        return (
            f"cellar node {cfg.node_id} serving tcp {self.tcp_address} "
            f"(http {self.http_address or 'off'}, segments {len(self.segments)} x "
            f"{format_size(cfg.segment_size_bytes)}) mounted on "
            f"{self.control.master if self.control else cfg.master}"
        )

    def status(self) -> dict[str, Any]:
        usage = self.index.usage()
        copier = self.control.cargo.copier if self.control else None
        segments = []
        for s in self.segments:
            row = usage.get(s.segment_id)
            segments.append({
                "segment_id": s.segment_id, "index": s.index, "size_bytes": s.size_bytes,
                "path": str(s.path) if s.path else "",
                "objects": row.objects if row else 0,
                "sealed_objects": row.sealed_objects if row else 0,
                "sealed_bytes": row.sealed_bytes if row else 0,
            })
        return {
            "node_id": self.cfg.node_id,
            "host_id": self.cfg.host_id,
            "tcp": self.tcp_address,
            "http": self.http_address,
            "segments": segments,
            "index": self.index.counts(),
            "restored": self.restored,
            "verify": self.verifier.status() if self.verifier else {},
            "master": self.control.status() if self.control else {},
            "data_plane": self.server.stats.snapshot() if self.server else {},
            "disk_tier": self.mover.status() if self.mover else {},
            "copier": copier.status() if copier else {},
        }
