"""The node side of the rdma transport: segments registered with the NIC, keys advertised,
queue pairs accepted.

When this node's machine has pyverbs and an RDMA device (`attach` probes; absent here, and then
it returns None and the node serves tcp and shm only), every segment is registered as a memory
region with remote read/write access, and `endpoints()` gives, per segment, the
Endpoint(transport="rdma", address, extra) the node mounts with: extra is the packed
`SegmentKey` (rkey, base address, size, file st_dev/st_ino), address is
"<device>/<port>/<gid hex>/<extra hex>" (see cellar.transfer.rdma).

Clients connect one RC queue pair each through an RDMA_CONNECT frame on the node's TCP port:
`NodeAccess.rdma_acceptor` is set to `accept`, which creates a queue pair, connects it to the
client's and answers with its own description; `NodeAccess.rdma_connect` calls it only for a
frame that carries an authentic, current grant for this node (a stranger gets no queue pair). The node never posts work requests; its queue
pairs are only targets of one-sided READ/WRITE, and the bytes a client WRITEs are recorded only
when its COMMIT passes the same checks as a TCP write (NodeAccess.commit). At most
`max_queue_pairs` are kept: beyond that the oldest is closed (its client reconnects).

It never touches payload bytes and never blocks on the network.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from cellar.storage_node.segment import Segment
from cellar.transfer import verbs
from cellar.transfer.frame import ST_INTERNAL, FrameError
from cellar.transfer.rdma import SegmentKey, format_endpoint

log = logging.getLogger("cellar.node.rdma")

DEFAULT_MAX_QUEUE_PAIRS = 1024


class NodeRdma:
    def __init__(self, device: verbs.Device, segments: Sequence[Segment], *,
                 max_queue_pairs: int = DEFAULT_MAX_QUEUE_PAIRS) -> None:
        if max_queue_pairs < 1:
            raise ValueError("max_queue_pairs must be >= 1")
        self.device = device
        self.max_queue_pairs = max_queue_pairs
        self._lock = threading.Lock()
        self._qps: collections.deque[verbs.QueuePair] = collections.deque()
        self._regions: list[verbs.MemoryRegion] = []
        self.keys: dict[int, SegmentKey] = {}
        try:
            for seg in segments:
                region = device.register(seg.memory, remote_write=True)
                self._regions.append(region)
                dev = ino = 0
                if seg.path is not None:
                    st = os.stat(seg.path)
                    dev, ino = st.st_dev, st.st_ino
                self.keys[seg.segment_id] = SegmentKey(region.rkey, region.addr, seg.size_bytes,
                                                       dev, ino)
        except BaseException:
            self.close()
            raise

    def endpoints(self) -> dict[int, tuple[str, bytes]]:
        """segment_id -> (address, extra) of its rdma Endpoint."""
        return {sid: format_endpoint(self.device.name, self.device.port, self.device.gid, key)
                for sid, key in self.keys.items()}

    def pb_endpoints(self) -> dict[int, Any]:
        """segment_id -> proto Endpoint, for the mount request."""
        from cellar.proto import cellar_pb2 as pb

        return {sid: pb.Endpoint(transport="rdma", address=address, extra=extra)
                for sid, (address, extra) in self.endpoints().items()}

    def accept(self, client_info: bytes) -> bytes:
        """RDMA_CONNECT: a queue pair connected to the client's; returns our description."""
        try:
            remote = verbs.QpInfo.unpack(bytes(client_info))
            qp = self.device.create_qp()
            try:
                qp.connect(remote)
            except BaseException:
                qp.close()
                raise
        except verbs.VerbsError as e:
            raise FrameError(ST_INTERNAL, f"rdma connect: {e}") from None
        with self._lock:
            self._qps.append(qp)
            old = self._qps.popleft() if len(self._qps) > self.max_queue_pairs else None
        if old is not None:
            old.close()
        return qp.info.pack()

    @property
    def queue_pairs(self) -> int:
        return len(self._qps)

    def close(self) -> None:
        with self._lock:
            qps, self._qps = list(self._qps), collections.deque()
        for qp in qps:
            qp.close()
        for region in self._regions:
            try:
                region.close()
            except verbs.VerbsError:
                pass
        self._regions = []


def attach(segments: Sequence[Segment], access: Any, control: Any = None, *,
           device: verbs.Device | None = None) -> NodeRdma | None:
    """Serve rdma when this machine can: register `segments`, route RDMA_CONNECT frames of
    `access` (a NodeAccess) here, and give `control` (a ControlLoop) the rdma endpoints to
    mount with (its `extra_endpoints`: segment_id -> [pb.Endpoint]). None (and one log line)
    without pyverbs or a device; the caller closes the result after the data server stopped."""
    if device is None:
        try:
            device = verbs.open_device()
        except verbs.RdmaUnavailable as e:
            log.info("rdma off: %s", e)
            return None
    try:
        rdma = NodeRdma(device, segments)
    except verbs.VerbsError as e:
        log.warning("rdma off: cannot register segments: %s", e)
        return None
    access.rdma_acceptor = rdma.accept
    if control is not None:
        control.extra_endpoints = {sid: [ep] for sid, ep in rdma.pb_endpoints().items()}
    log.info("rdma on %s port %d: %d segments registered", device.name, device.port,
             len(rdma.keys))
    return rdma
