"""NodeConfig: every setting of a storage node, with its unit and help text.

Layered like every Cellar process (defaults < file < `CELLAR_NODE_*` environment < flags) by
`cellar.config`. `validate()` names the offending field. Identity settings (`node_id`,
`host_id`) default to values derived from the machine; give `--node-id` explicitly to keep the
same segment ids (and, from the restart issue on, the same memory) across restarts.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass

from cellar import http as http_limits
from cellar.config import UNIT_BYTES, UNIT_SECONDS, require, setting
from cellar.coord.target import is_etcd_url, parse_etcd_url
from cellar.errors import InvalidArgument
from cellar.transfer.base import local_host_id
from cellar.transfer.spin_wait import MAX_SPIN_US
from cellar.units import WILDCARD_HOSTS, parse_host_port

ENV_PREFIX = "CELLAR_NODE_"
DEFAULT_DATA_SPIN_US = 300  # as the SDK's CELLAR_SPIN_US (make bench-spin, docs/sdk.md)
PAGE_BYTES = 4096
MIN_SEGMENT_BYTES = 1 << 20  # 1 MiB: smaller is useless and makes bin rounding dominate
MAX_SEGMENTS = 64
MAX_NODE_ID_CHARS = 128
_NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def default_node_id() -> str:
    """Hostname-derived with a random suffix, so two nodes on one machine never collide."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0]) or "node"
    return f"{host[:64]}-{secrets.token_hex(3)}"


def default_host_id() -> str:
    """The same value for every node on this machine (and what same-host clients compare)."""
    return local_host_id()


@dataclass
class NodeConfig:
    master: str = setting(
        "127.0.0.1:50051",
        "master address HOST:PORT, or etcd://HOST:PORT[,HOST:PORT]/CLUSTER to find and follow "
        "the leader of an HA cluster",
    )
    listen: str = setting("127.0.0.1:0", "data-plane (tcp) listen address HOST:PORT; port 0 = any")
    advertise_host: str = setting(
        "", "host clients use to reach this node; '' = the listen host (hostname if wildcard)"
    )
    http: str = setting("", "HTTP address HOST:PORT for /metrics, /health, /api/v1/status; '' = off")
    segment_size_bytes: int = setting(
        1 << 30, "size of each segment (also --segment-size)", unit=UNIT_BYTES
    )
    segments: int = setting(1, "number of segments this node contributes")
    node_id: str = setting(
        None, "stable node id; default: hostname plus a random suffix",
        default_factory=default_node_id,
    )
    host_id: str = setting(
        None, "machine id shared by every node on this host (same-host clients use shm)",
        default_factory=default_host_id,
    )
    shm_dir: str = setting("/dev/shm", "directory of the segment files (tmpfs or hugetlbfs)")
    hugepages: bool = setting(False, "back segments with huge pages (shm_dir must be hugetlbfs)")
    mlock: bool = setting(False, "lock segment memory into RAM (needs RLIMIT_MEMLOCK)")
    keep_segments_on_exit: bool = setting(
        False, "keep the segment files on shutdown (for restart re-attach)"
    )
    disk_dir: str = setting(
        "", "directory of the disk tier's file (a real disk: hostPath or PVC); '' = no disk tier "
        "(docs/disk-tier.md)"
    )
    disk_size_bytes: int = setting(
        0, "size of the disk tier (also --disk-size, e.g. 64GiB); 0 = no disk tier",
        unit=UNIT_BYTES,
    )
    journal_dir: str = setting(
        "", "directory of the index journal (restart re-attach); '' = shm_dir "
        "(/dev/shm with hugepages, since hugetlbfs files take no write())"
    )
    verify_rate_bytes_per_s: int = setting(
        1 << 30, "how fast a restarted node re-checks restored objects' checksums",
        unit=UNIT_BYTES,
    )
    cluster_secret_file: str = setting(
        "", "file holding the cluster secret; '' = CELLAR_CLUSTER_SECRET or ~/.cellar/cluster-secret"
    )
    heartbeat_interval_s: float = setting(
        1.0, "heartbeat interval (the master may ask for another)", unit=UNIT_SECONDS
    )
    max_frame_payload_bytes: int = setting(
        64 << 20, "largest payload of one data-plane frame", unit=UNIT_BYTES
    )
    max_connections: int = setting(256, "most concurrent data-plane connections", unit="connections")
    max_connections_per_peer: int = setting(
        64, "most concurrent data-plane connections from one peer address that have not yet "
        "sent an authentic grant (authenticated ones never count); at the limit a newer one "
        "closes the oldest of them if the address has shown a grant, else it is refused",
        unit="connections"
    )
    auth_timeout_s: float = setting(
        1.0, "a data-plane connection must send a frame with an authentic grant within this of "
        "being accepted, or it is closed", unit=UNIT_SECONDS
    )
    unauthenticated_backoff_s: float = setting(
        10.0, "a connection from an address that never showed an authentic grant, and that "
        "ends without one, keeps its slot (of max_connections_per_peer) charged to that "
        "address for this long, so renewing connections does not help a stranger",
        unit=UNIT_SECONDS
    )
    http_max_connections: int = http_limits.max_connections_setting()
    http_max_connections_per_peer: int = http_limits.max_connections_per_peer_setting()
    http_header_timeout_s: float = http_limits.header_timeout_setting()
    http_tls: bool = http_limits.tls_setting()
    refusal_log_interval_s: float = setting(
        10.0, "at most one log line per peer per this about refused grants, commits and "
        "connections, with a count (all are counted in node_refusals_total and "
        "node_connections_refused_total)", unit=UNIT_SECONDS
    )
    idle_timeout_s: float = setting(
        300.0, "a data-plane connection must send each request's header within this of the "
        "server starting to wait for it (however slowly the bytes drip), and each send must "
        "complete within it", unit=UNIT_SECONDS
    )
    frame_timeout_s: float = setting(
        30.0, "a WRITE's payload must arrive within this of its header", unit=UNIT_SECONDS
    )
    data_spin_us: int = setting(
        DEFAULT_DATA_SPIN_US, "how long an authenticated plain-TCP data connection polls for "
        "its next request before it blocks (a waiting thread's halted vCPU costs a wake-up of "
        "50-60 us on VMs); one connection of the node spins at a time, and one whose windows "
        "keep ending empty rests (transfer/spin_wait.py); 0: never", unit="microseconds"
    )
    tls_cert_file: str = setting(
        "", "PEM certificate (chain) of this node: with tls_key_file, the data port (tcp, and "
        "the shm/rdma COMMIT line) speaks TLS and is advertised as tls://HOST:PORT (empty: "
        "plaintext)"
    )
    tls_key_file: str = setting("", "PEM private key of tls_cert_file")
    master_tls_cert_file: str = setting(
        "", "PEM client certificate (subject CN node:<node id>) this node presents to the "
        "master (mutual TLS: --master is then the master's node_listen port, and the node "
        "sends no node credential). Separate from tls_cert_file, which is the data port's "
        "server certificate (empty: the node credential)"
    )
    master_tls_key_file: str = setting("", "PEM private key of master_tls_cert_file")
    grant_skew_s: float = setting(
        1.0, "tolerated error of this node's estimate of the master clock", unit=UNIT_SECONDS
    )
    master_timeout_s: float = setting(5.0, "deadline of each RPC to the master", unit=UNIT_SECONDS)

    def validate(self) -> None:
        if is_etcd_url(self.master):
            try:
                parse_etcd_url(self.master)
            except InvalidArgument as exc:
                require(False, "master", str(exc))
        for name in ("listen",) if is_etcd_url(self.master) else ("master", "listen"):
            try:
                parse_host_port(getattr(self, name))
            except ValueError as exc:
                require(False, name, str(exc))
        if self.http:
            try:
                parse_host_port(self.http)
            except ValueError as exc:
                require(False, "http", str(exc))
        require(
            self.segment_size_bytes >= MIN_SEGMENT_BYTES, "segment_size_bytes",
            f"{self.segment_size_bytes} bytes is below the minimum {MIN_SEGMENT_BYTES}",
        )
        require(
            self.segment_size_bytes % PAGE_BYTES == 0, "segment_size_bytes",
            f"{self.segment_size_bytes} bytes is not a multiple of the page size {PAGE_BYTES}",
        )
        require(1 <= self.segments <= MAX_SEGMENTS, "segments", f"must be 1..{MAX_SEGMENTS}")
        require(
            bool(_NODE_ID_RE.match(self.node_id)) and len(self.node_id) <= MAX_NODE_ID_CHARS,
            "node_id",
            f"{self.node_id!r}: use 1..{MAX_NODE_ID_CHARS} of A-Z a-z 0-9 . _ - "
            "(it names the segment files)",
        )
        require(bool(self.host_id) and len(self.host_id) <= 256, "host_id", "must be 1..256 chars")
        require(bool(self.shm_dir), "shm_dir", "must not be empty")
        require(os.path.isdir(self.shm_dir), "shm_dir", f"{self.shm_dir} is not a directory")
        require(
            0.01 <= self.heartbeat_interval_s <= 60.0, "heartbeat_interval_s", "must be 10ms..60s"
        )
        require(
            PAGE_BYTES <= self.max_frame_payload_bytes <= 1 << 30, "max_frame_payload_bytes",
            "must be 4KiB..1GiB",
        )
        require(self.verify_rate_bytes_per_s >= 1 << 20, "verify_rate_bytes_per_s",
                "must be at least 1MiB")
        require(bool(self.disk_dir) == bool(self.disk_size_bytes), "disk_dir",
                "disk_dir and disk_size_bytes go together (both set, or neither)")
        if self.disk_dir:
            require(os.path.isdir(self.disk_dir), "disk_dir", f"{self.disk_dir} is not a directory")
            require(self.disk_size_bytes >= MIN_SEGMENT_BYTES
                    and self.disk_size_bytes % PAGE_BYTES == 0, "disk_size_bytes",
                    f"{self.disk_size_bytes} bytes: must be at least {MIN_SEGMENT_BYTES} and a "
                    f"multiple of the page size {PAGE_BYTES}")
        if self.journal_dir:
            require(os.path.isdir(self.journal_dir), "journal_dir",
                    f"{self.journal_dir} is not a directory")
        require(1 <= self.max_connections <= 65536, "max_connections", "must be 1..65536")
        require(1 <= self.max_connections_per_peer <= self.max_connections,
                "max_connections_per_peer", "must be 1..max_connections")
        require(0.1 <= self.idle_timeout_s <= 86400, "idle_timeout_s", "must be 0.1s..1 day")
        require(0.01 <= self.auth_timeout_s <= 60, "auth_timeout_s", "must be 0.01s..60s")
        require(0 <= self.unauthenticated_backoff_s <= 3600, "unauthenticated_backoff_s",
                "must be 0s..1 hour")
        http_limits.check_limits(self.http_max_connections, self.http_max_connections_per_peer,
                                 self.http_header_timeout_s)
        require(0.1 <= self.refusal_log_interval_s <= 86400, "refusal_log_interval_s",
                "must be 0.1s..1 day")
        require(0.1 <= self.frame_timeout_s <= 3600, "frame_timeout_s", "must be 0.1s..1 hour")
        require(0 <= self.data_spin_us <= MAX_SPIN_US, "data_spin_us",
                f"must be 0..{MAX_SPIN_US} microseconds")
        require(bool(self.tls_cert_file) == bool(self.tls_key_file), "tls_cert_file",
                "tls_cert_file and tls_key_file go together")
        require(not self.http_tls or bool(self.tls_cert_file), "http_tls",
                "an HTTPS port needs this process's certificate (tls_cert_file, tls_key_file)")
        require(bool(self.master_tls_cert_file) == bool(self.master_tls_key_file),
                "master_tls_cert_file", "master_tls_cert_file and master_tls_key_file go together")
        for name in ("tls_cert_file", "tls_key_file", "master_tls_cert_file", "master_tls_key_file"):
            path = getattr(self, name)
            require(not path or os.path.isfile(path), name, f"{path} is not a file")
        require(0.0 <= self.grant_skew_s <= 60.0, "grant_skew_s", "must be 0..60s")
        require(0.05 <= self.master_timeout_s <= 300.0, "master_timeout_s", "must be 50ms..300s")

    @property
    def journal_directory(self) -> str:
        if self.journal_dir:
            return self.journal_dir
        if self.disk_dir:  # the disk tier's objects outlive the machine's tmpfs
            return self.disk_dir
        return "/dev/shm" if self.hugepages and os.path.isdir("/dev/shm") else self.shm_dir

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return parse_host_port(self.listen)

    @property
    def http_host_port(self) -> tuple[str, int] | None:
        return parse_host_port(self.http) if self.http else None

    def advertised_host(self, listen_host: str) -> str:
        """The host part of the tcp endpoint the node mounts with."""
        if self.advertise_host:
            return self.advertise_host
        if listen_host in WILDCARD_HOSTS:
            return socket.gethostname()
        return listen_host
