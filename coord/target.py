"""`etcd://HOST:PORT[,HOST:PORT...]/NAME` addresses and the key layout under /cellar/<NAME>/.

Keys (all values UTF-8):
    /cellar/<cluster>/leader            JSON LeaderRecord of the current leader, attached to
                                        the leader's lease (it vanishes when the lease lapses)
    /cellar/<cluster>/epoch             decimal: the last epoch any leader was given; a new
                                        leader writes max(last + 1, wall ms) in the same
                                        transaction that makes it leader, so epochs only grow
    /cellar/<cluster>/masters/<id>      JSON LeaderRecord-shaped entry of every live master
                                        (leader and standbys), attached to its own lease
    /cellar/<cluster>/nodes             JSON list of the node ids the leader has mounted, kept
                                        after it dies (no lease): the next leader knows whose
                                        reports complete its rebuild; written by the leader
                                        only while `leader` still holds its record
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from cellar.errors import InvalidArgument
from cellar.units import parse_host_port

SCHEME = "etcd://"
KEY_ROOT = "/cellar/"
MAX_CLUSTER_NAME_CHARS = 64
MAX_ENDPOINTS = 16
MAX_RECORD_BYTES = 4096  # a leader record larger than this is refused as corrupt
MAX_NODES_LISTED = 4096  # a node list longer than this is ignored (the rebuild grace applies)
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def is_etcd_url(address: str) -> bool:
    return address.startswith(SCHEME)


def check_cluster_name(name: str) -> str:
    if not _CLUSTER_NAME.match(name):
        raise InvalidArgument(
            f"cluster name {name!r} must be 1-{MAX_CLUSTER_NAME_CHARS} characters of "
            "letters, digits, '_', '.', '-', starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class EtcdTarget:
    """Where etcd is and which Cellar cluster inside it."""

    endpoints: tuple[str, ...]
    cluster: str

    @property
    def prefix(self) -> str:
        return f"{KEY_ROOT}{self.cluster}/"

    @property
    def leader_key(self) -> str:
        return self.prefix + "leader"

    @property
    def epoch_key(self) -> str:
        return self.prefix + "epoch"

    @property
    def nodes_key(self) -> str:
        return self.prefix + "nodes"

    @property
    def removals_prefix(self) -> str:
        return self.prefix + "removals/"

    @property
    def tenants_prefix(self) -> str:
        return self.prefix + "tenants/"

    @property
    def tokens_prefix(self) -> str:
        """The admin API's tokens and revocations (cellar.master.serving.token_log)."""
        return self.prefix + "tokens/"

    @property
    def masters_prefix(self) -> str:
        return self.prefix + "masters/"

    def url(self) -> str:
        return f"{SCHEME}{','.join(self.endpoints)}/{self.cluster}"


def parse_endpoints(raw: str) -> tuple[str, ...]:
    """`HOST:PORT[,HOST:PORT...]` -> endpoints, each checked; InvalidArgument when malformed."""
    endpoints = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not endpoints:
        raise InvalidArgument("no etcd endpoint given (expected HOST:PORT[,HOST:PORT...])")
    if len(endpoints) > MAX_ENDPOINTS:
        raise InvalidArgument(f"{len(endpoints)} etcd endpoints; at most {MAX_ENDPOINTS}")
    for endpoint in endpoints:
        try:
            parse_host_port(endpoint)
        except ValueError as exc:
            raise InvalidArgument(f"etcd endpoint {endpoint!r}: {exc}") from None
    return endpoints


def parse_etcd_url(url: str) -> EtcdTarget:
    """`etcd://HOST:PORT[,HOST:PORT...]/NAME` -> EtcdTarget; InvalidArgument when malformed."""
    if not is_etcd_url(url):
        raise InvalidArgument(f"{url!r} is not an etcd address (etcd://HOST:PORT[,...]/CLUSTER)")
    rest = url[len(SCHEME):]
    hosts, slash, cluster = rest.partition("/")
    if not slash or not cluster:
        raise InvalidArgument(f"{url!r} names no cluster (etcd://HOST:PORT[,...]/CLUSTER)")
    return EtcdTarget(parse_endpoints(hosts), check_cluster_name(cluster.rstrip("/")))


@dataclass(frozen=True)
class LeaderRecord:
    """What a master publishes about itself: its id, gRPC and HTTP addresses and, for the
    leader, the epoch it serves under (0 for a standby's `masters/` entry)."""

    master_id: str
    address: str
    http: str
    epoch: int

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> LeaderRecord:
        """Parse a stored record; ValueError when it is not one (never trust etcd's content)."""
        if len(raw) > MAX_RECORD_BYTES:
            raise ValueError(f"record of {len(raw)} bytes exceeds {MAX_RECORD_BYTES}")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("record is not a JSON object")
        master_id, address, http, epoch = (data.get(k) for k in ("master_id", "address", "http", "epoch"))
        if not (isinstance(master_id, str) and isinstance(address, str) and isinstance(http, str)
                and isinstance(epoch, int) and epoch >= 0):
            raise ValueError(f"malformed record {data!r}")
        parse_host_port(address)
        return cls(master_id, address, http, epoch)


def encode_node_ids(node_ids: frozenset[str]) -> bytes:
    return json.dumps(sorted(node_ids), separators=(",", ":")).encode()


def decode_node_ids(raw: bytes) -> frozenset[str] | None:
    """The stored node list, or None when absent or not a list of strings (never trust etcd)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, list) or len(data) > MAX_NODES_LISTED:
        return None
    if not all(isinstance(item, str) for item in data):
        return None
    return frozenset(data)
