"""The few RDMA verbs Cellar uses, behind a small interface, and its pyverbs implementation.

Everything above this module (memory-region bookkeeping, key exchange, chunking, completion
tracking, error mapping: `transfer/rdma.py`, `storage_node/rdma.py`) talks to a `Device` only,
so it runs unchanged on a fake device in unit tests; only `PyverbsDevice` touches pyverbs
(Debian's python3-pyverbs), and it is imported lazily: a machine without pyverbs or without an
RDMA device gets `RdmaUnavailable` from `open_device`, never an ImportError at import time.

The interface (one protection domain per `Device`):
- `register(buffer, remote_write)` -> `MemoryRegion` (addr, length, lkey, rkey): pins the
  buffer's pages for the NIC; `remote_write` also allows peers to RDMA WRITE/READ it (node
  segments), otherwise local access only (client buffers; a read-only one, e.g. a put's
  bytes, only as a source).
- `create_qp()` -> `QueuePair`: an RC queue pair with its own completion queue;
  `qp.info` describes it (`QpInfo`: lid, gid, qpn, psn, port, mtu) for the peer, and
  `qp.connect(remote_info)` moves it INIT -> RTR -> RTS.
- `qp.post(wr_id, opcode, local_addr, length, lkey, remote_addr, rkey)`: one signalled
  one-sided READ or WRITE; `qp.poll(max_n, timeout_s)` returns up to max_n `Completion`s
  (wr_id, ok, status text), waiting at most timeout_s for the first.

What it must never do: decide policy (chunk sizes, retries, which memory to register), or
raise anything but `VerbsError` / `RdmaUnavailable` out of a verbs call.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Protocol

OPCODE_WRITE = 1
OPCODE_READ = 2

# lid, port, mtu (enum value), qpn, psn, gid
_QP_INFO = struct.Struct("<HBBII16s")


class RdmaUnavailable(Exception):
    """No pyverbs, or no usable RDMA device on this machine."""


class VerbsError(Exception):
    """A verbs call failed (registration, QP state change, post, poll)."""


@dataclass(frozen=True, slots=True)
class QpInfo:
    """What a peer needs to connect its RC queue pair to ours."""

    lid: int
    port: int
    mtu: int
    qpn: int
    psn: int
    gid: bytes  # 16 bytes (all zero on InfiniBand without GRH)

    def pack(self) -> bytes:
        return _QP_INFO.pack(self.lid, self.port, self.mtu, self.qpn, self.psn, self.gid)

    @classmethod
    def unpack(cls, raw: bytes) -> QpInfo:
        if len(raw) != _QP_INFO.size:
            raise VerbsError(f"queue-pair info of {len(raw)} bytes, want {_QP_INFO.size}")
        lid, port, mtu, qpn, psn, gid = _QP_INFO.unpack(raw)
        return cls(lid, port, mtu, qpn, psn, gid)


@dataclass(frozen=True, slots=True)
class Completion:
    wr_id: int
    ok: bool
    status: str = ""


class MemoryRegion(Protocol):
    addr: int
    length: int
    lkey: int
    rkey: int

    def close(self) -> None: ...


class QueuePair(Protocol):
    info: QpInfo

    def connect(self, remote: QpInfo) -> None: ...

    def post(self, wr_id: int, opcode: int, local_addr: int, length: int, lkey: int,
             remote_addr: int, rkey: int) -> None: ...

    def poll(self, max_n: int, timeout_s: float) -> list[Completion]: ...

    def close(self) -> None: ...


class Device(Protocol):
    name: str
    port: int
    gid: bytes

    def register(self, buffer: memoryview, *, remote_write: bool) -> MemoryRegion: ...

    def create_qp(self) -> QueuePair: ...

    def close(self) -> None: ...


def list_devices() -> list[str]:
    """RDMA device names `ibv_devices` lists ([] without the tool or a device)."""
    tool = shutil.which("ibv_devices")
    if tool is None:
        return []
    try:
        out = subprocess.run([tool], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    names = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] not in ("device", "------"):
            names.append(parts[0])
    return names


def open_device(name: str | None = None, *, port: int = 1, gid_index: int = 0) -> Device:
    """The named (or first) RDMA device through pyverbs; RdmaUnavailable if there is none."""
    try:
        import pyverbs.device  # noqa: F401 - probe
    except ImportError:
        raise RdmaUnavailable("pyverbs is not installed (Debian: python3-pyverbs)") from None
    return PyverbsDevice(name, port=port, gid_index=gid_index)


# ---- pyverbs ----------------------------------------------------------------------------
# Exercised only where a device exists (tests/integration/test_rdma_device.py); the code above
# it is unit-tested against tests' FakeDevice.

class _PvMr:
    def __init__(self, mr: Any, addr: int, length: int) -> None:
        self._mr = mr
        self.addr = addr
        self.length = length
        self.lkey = int(mr.lkey)
        self.rkey = int(mr.rkey)

    def close(self) -> None:
        try:
            self._mr.close()
        except Exception as e:  # noqa: BLE001 - pyverbs raises its own types
            raise VerbsError(f"dereg_mr: {e}") from None


class _PvQp:
    def __init__(self, dev: PyverbsDevice, depth: int) -> None:
        from pyverbs.cq import CQ
        from pyverbs.qp import QP, QPCap, QPInitAttr

        self._dev = dev
        try:
            self._cq = CQ(dev.ctx, depth)
            cap = QPCap(max_send_wr=depth, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
            attr = QPInitAttr(qp_type=2, scq=self._cq, rcq=self._cq, cap=cap)  # 2: IBV_QPT_RC
            self._qp = QP(dev.pd, attr)
        except Exception as e:  # noqa: BLE001
            raise VerbsError(f"create_qp: {e}") from None
        psn = int(time.monotonic_ns()) & 0xFFFFFF
        self.info = QpInfo(dev.lid, dev.port, dev.mtu, int(self._qp.qp_num), psn, dev.gid)

    def connect(self, remote: QpInfo) -> None:
        from pyverbs.addr import AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        try:
            attr = QPAttr(qp_state=2, cur_qp_state=0, port_num=self._dev.port)  # INIT
            attr.qp_access_flags = _access(remote_write=True)
            attr.path_mtu = min(self.info.mtu, remote.mtu)
            attr.dest_qp_num = remote.qpn
            attr.rq_psn = remote.psn
            attr.sq_psn = self.info.psn
            attr.max_dest_rd_atomic = 16
            attr.max_rd_atomic = 16
            attr.min_rnr_timer = 12
            attr.timeout = 14
            attr.retry_cnt = 7
            attr.rnr_retry = 7
            gr = GlobalRoute(dgid=_gid_obj(remote.gid), sgid_index=self._dev.gid_index)
            attr.ah_attr = AHAttr(gr=gr, is_global=1 if any(remote.gid) else 0,
                                  dlid=remote.lid, port_num=self._dev.port)
            self._qp.to_rts(attr)
        except Exception as e:  # noqa: BLE001
            raise VerbsError(f"connect qp: {e}") from None

    def post(self, wr_id: int, opcode: int, local_addr: int, length: int, lkey: int,
             remote_addr: int, rkey: int) -> None:
        from pyverbs.wr import SGE, SendWR

        ibv_op = 0 if opcode == OPCODE_WRITE else 4  # IBV_WR_RDMA_WRITE / IBV_WR_RDMA_READ
        try:
            wr = SendWR(wr_id=wr_id, opcode=ibv_op, num_sge=1,
                        sg=[SGE(local_addr, length, lkey)], send_flags=2)  # SIGNALED
            wr.set_wr_rdma(rkey, remote_addr)
            self._qp.post_send(wr)
        except Exception as e:  # noqa: BLE001
            raise VerbsError(f"post_send: {e}") from None

    def poll(self, max_n: int, timeout_s: float) -> list[Completion]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                n, wcs = self._cq.poll(max_n)
            except Exception as e:  # noqa: BLE001
                raise VerbsError(f"poll_cq: {e}") from None
            if n > 0:
                return [Completion(int(wc.wr_id), int(wc.status) == 0,
                                   "" if int(wc.status) == 0 else f"wc status {wc.status}")
                        for wc in wcs[:n]]
            if time.monotonic() >= deadline:
                return []
            time.sleep(0)  # busy poll, yielding the GIL

    def close(self) -> None:
        for obj in (self._qp, self._cq):
            try:
                obj.close()
            except Exception:  # noqa: BLE001,S110 - best effort at teardown
                pass


def _access(*, remote_write: bool, local_write: bool = True) -> int:
    # IBV_ACCESS_LOCAL_WRITE 1, REMOTE_WRITE 2, REMOTE_READ 4 (remote access needs LOCAL_WRITE)
    if remote_write:
        return 1 | 2 | 4
    return 1 if local_write else 0


def _gid_obj(raw: bytes) -> Any:
    from pyverbs.addr import GID

    gid = GID()
    text = raw.hex()
    gid.gid = ":".join(text[i:i + 4] for i in range(0, 32, 4))
    return gid


class PyverbsDevice:
    """A pyverbs context + protection domain on one port of one device."""

    def __init__(self, name: str | None, *, port: int = 1, gid_index: int = 0,
                 qp_depth: int = 256) -> None:
        import pyverbs.device as d
        from pyverbs.pd import PD

        names = [dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
                 for dev in d.get_device_list()]
        if not names:
            raise RdmaUnavailable("no RDMA device (ibv_devices lists none)")
        self.name = name or names[0]
        if self.name not in names:
            raise RdmaUnavailable(f"no RDMA device {self.name!r}; have {', '.join(names)}")
        try:
            self.ctx = d.Context(name=self.name)
            self.pd = PD(self.ctx)
            pattr = self.ctx.query_port(port)
            self.lid = int(pattr.lid)
            self.mtu = int(pattr.active_mtu)
            gid = self.ctx.query_gid(port, gid_index)
            self.gid = bytes.fromhex(str(gid).replace(":", ""))
        except Exception as e:  # noqa: BLE001
            raise RdmaUnavailable(f"cannot open {self.name}: {e}") from None
        self.port = port
        self.gid_index = gid_index
        self.qp_depth = qp_depth

    def register(self, buffer: memoryview, *, remote_write: bool) -> MemoryRegion:
        from pyverbs.mr import MR

        from cellar.transfer.shm import buffer_address

        addr = buffer_address(buffer)
        try:
            access = _access(remote_write=remote_write, local_write=not buffer.readonly)
            mr = MR(self.pd, len(buffer), access, address=addr)
        except Exception as e:  # noqa: BLE001
            raise VerbsError(f"reg_mr of {len(buffer)} bytes: {e}") from None
        return _PvMr(mr, addr, len(buffer))

    def create_qp(self) -> QueuePair:
        return _PvQp(self, self.qp_depth)

    def close(self) -> None:
        for obj in (self.pd, self.ctx):
            try:
                obj.close()
            except Exception:  # noqa: BLE001,S110
                pass
