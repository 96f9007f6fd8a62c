"""MasterConfig: every setting and limit of the master, with its unit, default and help.

Layered by `cellar.config` (defaults < file < `CELLAR_MASTER_*` environment < flags) and
printed by `cellar master --print-config`. `validate()` rejects inconsistent values naming
the field, so a bad configuration stops the process before it listens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cellar import http as http_limits
from cellar.config import UNIT_BYTES, UNIT_SECONDS, require, setting
from cellar.coord.election import MAX_LEASE_TTL_S, MIN_LEASE_TTL_S
from cellar.coord.target import check_cluster_name, parse_endpoints
from cellar.errors import ConfigError, InvalidArgument
from cellar.master.state.records import TenantQuota
from cellar.master.state.tenants import DEFAULT_TENANT, TENANT_NAME
from cellar.master.state.tiers import TierSettings
from cellar.proto.tiers import MOVE_DEADLINE_MARGIN_S
from cellar.units import parse_host_port, parse_size_bytes

ENV_PREFIX = "CELLAR_MASTER_"
MAX_QUOTA = 1 << 62  # a quota above this is no quota a protobuf uint64 reply could not carry
# A ListKeys reply of max_list_keys keys of max_key_bytes each must fit grpc_max_message_bytes:
# each key costs its bytes plus a tag and a length varint (<= 4 bytes for keys up to 64 KiB),
# and the reply header and `more` flag fit in the slack.
LIST_KEY_WIRE_OVERHEAD_BYTES = 4
LIST_REPLY_SLACK_BYTES = 256


_QUOTA_SIZES = ("quota_bytes", "quota_writing_bytes", "quota_hard_pin_bytes")
_QUOTA_KEYS = frozenset({*_QUOTA_SIZES, "quota_objects", "hard_pin", "name"})


def parse_tenant_quota(name: str, raw: Any, field: str = "tenants") -> TenantQuota:
    """{"quota_bytes": "4GiB", "quota_objects": 1000, "hard_pin": true, ...} -> TenantQuota;
    ConfigError naming `field`."""
    if not isinstance(name, str) or not TENANT_NAME.match(name):
        raise ConfigError(field, f"bad tenant name {name!r} (letters, digits, . _ -; at most 128)")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(field, f"tenant {name!r}: expected a mapping with quota_bytes/quota_objects")
    unknown = set(raw) - _QUOTA_KEYS
    if unknown:
        raise ConfigError(field, f"tenant {name!r}: unknown keys {sorted(unknown)}")
    # no quota_bytes: the default quota (a fraction of capacity); "unlimited" (or 0) is explicit.
    # `default` is unlimited unless given one: it is the one tenant of a cluster without tenants.
    default_bytes = name != DEFAULT_TENANT and raw.get("quota_bytes") is None
    if raw.get("quota_bytes") == "unlimited":
        raw = {**raw, "quota_bytes": 0}
    try:
        sizes = {key: parse_size_bytes(raw.get(key, 0) or 0) for key in _QUOTA_SIZES}
        quota_objects = raw.get("quota_objects", 0) or 0
        if isinstance(quota_objects, bool) or not isinstance(quota_objects, (int, str)):
            raise ValueError(f"quota_objects: not an integer: {quota_objects!r}")
        quota_objects = int(quota_objects)
        hard_pin = raw.get("hard_pin", False)
        if not isinstance(hard_pin, bool):
            raise ValueError(f"hard_pin: not a boolean: {hard_pin!r}")
    except (ValueError, TypeError) as exc:
        raise ConfigError(field, f"tenant {name!r}: {exc}") from None
    if min(sizes.values()) < 0 or quota_objects < 0:
        raise ConfigError(field, f"tenant {name!r}: quotas must be >= 0")
    if max(max(sizes.values()), quota_objects) > MAX_QUOTA:
        raise ConfigError(field, f"tenant {name!r}: quotas must be <= {MAX_QUOTA}")
    return TenantQuota(sizes["quota_bytes"], quota_objects, sizes["quota_writing_bytes"], hard_pin,
                       sizes["quota_hard_pin_bytes"], default_bytes)


@dataclass
class MasterConfig:
    listen: str = setting("127.0.0.1:50051", "gRPC listen address HOST:PORT (port 0 picks one)")
    http: str = setting("127.0.0.1:9400", "HTTP address for /metrics, /health and the admin API")
    fast_port: int = setting(
        0, "TCP port of the metadata fast line, on the listen host (0 = any free port; fix it "
        "when a firewall or a Kubernetes Service must name it)", unit="port"
    )
    cluster_secret_file: str = setting(
        "", "file holding the hex cluster secret for grant MACs (empty: ~/.cellar/cluster-secret; "
        "env CELLAR_CLUSTER_SECRET wins)"
    )
    tokens_file: str = setting(
        "", "JSON file of the tenant and admin tokens, hashed (cellar token create|list|revoke; "
        "empty: ~/.cellar/tokens.json). Every RPC and admin call needs a token from it (or a "
        "node credential)"
    )
    tls_cert_file: str = setting(
        "", "PEM certificate (chain) of this master: with tls_key_file, gRPC and the fast line "
        "speak TLS (empty: plaintext)"
    )
    tls_key_file: str = setting("", "PEM private key of tls_cert_file")
    tls_client_ca_file: str = setting(
        "", "PEM CA of the nodes' client certificates: with node_listen, a node presenting a "
        "certificate from it whose subject CN is node:<node id> is that node without a node "
        "credential (mutual TLS; needs tls_cert_file)"
    )
    node_listen: str = setting(
        "", "HOST:PORT of a second gRPC port for mutual-TLS nodes: it requires a client "
        "certificate chaining to tls_client_ca_file (empty: none). gRPC's Python server cannot "
        "ask for an optional certificate, so certificate-less clients keep `listen`"
    )
    refuse_node_credentials: bool = setting(
        False, "refuse the node credential (cellarnode_..., derived from the cluster secret): "
        "nodes join only with a mutual-TLS certificate on node_listen, so one compromised node "
        "cannot speak for another. Needs node_listen; not with etcd (nodes of an HA leader "
        "still use the credential)"
    )
    default_replicas: int = setting(1, "replicas per object when a put asks for 0", unit="replicas")
    max_replicas: int = setting(8, "most replicas one object may ask for", unit="replicas")
    max_key_bytes: int = setting(1024, "longest key, UTF-8 encoded", unit=UNIT_BYTES)
    max_batch_keys: int = setting(1024, "most keys (or pin ids) in one batched request", unit="keys")
    max_list_keys: int = setting(1000, "most keys one ListKeys page returns (its limit)", unit="keys")
    max_put_ahead_keys: int = setting(
        64, "most put-ahead allocations (docs/sdk.md) one PutStart or PutEnd is granted; "
        "0 grants none", unit="keys"
    )
    max_put_ahead_dropped_keys: int = setting(
        65_536, "most keys remembered with a version the master dropped on its own (evicted, or "
        "lost with its node) while an older put-ahead allocation was outstanding, so that no such "
        "allocation is bound to the key (a rebuild would prefer the dropped version); kept only "
        "while one is (at most write_grant_ttl_s). Beyond it the lowest is forgotten and every "
        "bind at or below it refused, whatever the key (the client puts again through PutStart)",
        unit="keys"
    )
    pin_ttl_s: float = setting(10.0, "a read pin (and its read grant) expires after this", unit=UNIT_SECONDS)
    read_trust_s: float = setting(
        0.5, "a client may read a key again from the replicas GetReplicas named, without asking, "
        "this long after it asked (one round trip instead of two); a remove or new version of a "
        "key read that recently is acknowledged only once it has passed (docs/sdk.md, trusted reads); "
        "0: clients ask every time", unit=UNIT_SECONDS
    )
    max_pins_per_client: int = setting(65536, "most live pins one client id may hold", unit="pins")
    write_grant_ttl_s: float = setting(
        30.0, "write grants expire and unfinished puts are revoked after this", unit=UNIT_SECONDS
    )
    grant_skew_s: float = setting(
        1.0, "clock-skew margin added before a revoked put's range is reused", unit=UNIT_SECONDS
    )
    heartbeat_interval_s: float = setting(1.0, "how often nodes are told to heartbeat", unit=UNIT_SECONDS)
    node_suspect_after_s: float = setting(
        3.0, "a node silent this long gets no new placements (SUSPECT)", unit=UNIT_SECONDS
    )
    node_expire_after_s: float = setting(
        10.0, "a node silent this long is EXPIRED and its replicas dropped", unit=UNIT_SECONDS
    )
    max_remove_tombstones: int = setting(
        262_144, "most removed keys remembered (with the allocation they removed) so that a node's "
        "late index report cannot bring them back, and as many dead writes (allocations of puts "
        "dropped before they completed); oldest forgotten first", unit="keys")
    request_id_memory_entries: int = setting(
        65_536, "most replies of mutating calls remembered by request id, so that a call carried "
        "twice (a lost reply, fast line then gRPC, a retry) gets the first call's result; oldest "
        "forgotten first (master/serving/request_memory.py). 0: off", unit="replies")
    request_id_memory_s: float = setting(
        120.0, "a remembered reply is forgotten this long after the call it answered (a repeat "
        "later than this runs again); keep it above the clients' call timeout", unit=UNIT_SECONDS)
    request_id_memory_bytes: int = setting(
        256 << 20, "most bytes of remembered replies (estimated: 128 bytes + 256 per key result); "
        "oldest forgotten first",
        unit=UNIT_BYTES)
    removal_log_file: str = setting(
        "", "a single master's removal log (cellar.master.serving.removal_log): acknowledged "
        "removes and upserts outlive a kill of the master. Empty: ~/.cellar/removals-<listen>.log; "
        "'none': off (a remove acknowledged just before a kill may come back). With etcd the log "
        "lives in etcd instead"
    )
    tenant_log_file: str = setting(
        "", "a single master's tenant log (cellar.master.serving.tenant_log): tenants created or "
        "changed through PUT /api/v1/tenants outlive a restart. Empty: "
        "~/.cellar/tenants-<listen>.json; 'none': off (such a tenant, and its objects, are gone "
        "after a restart). With etcd the log lives in etcd instead"
    )
    rebuild_grace_s: float = setting(
        5.0, "after a start, while nodes may still re-register and report their objects, a miss "
        "answers UNAVAILABLE (clients retry) instead of NOT_FOUND", unit=UNIT_SECONDS
    )
    new_node_ramp_s: float = setting(
        10.0, "a newly mounted node's placement weight ramps up over this", unit=UNIT_SECONDS
    )
    placement_choices: int = setting(3, "segments sampled per replica (power of k choices)", unit="segments")
    eviction_high_watermark: float = setting(
        0.90, "evict in the background when used/capacity exceeds this", unit="fraction"
    )
    eviction_low_watermark: float = setting(
        0.85, "background eviction stops at this used/capacity", unit="fraction"
    )
    demote_high_watermark: float = setting(
        0.80, "disk tier: demote a node's coldest DRAM objects to its disk above this "
        "used/capacity of its DRAM", unit="fraction"
    )
    demote_low_watermark: float = setting(
        0.65, "disk tier: demotion stops at this used/capacity of the node's DRAM", unit="fraction"
    )
    disk_high_watermark: float = setting(
        0.95, "disk tier: evict the disk's oldest objects above this used/capacity", unit="fraction"
    )
    disk_low_watermark: float = setting(
        0.90, "disk tier: disk eviction stops at this used/capacity", unit="fraction"
    )
    promote_window_s: float = setting(
        30.0, "disk tier: a disk object read twice within this window is promoted to DRAM",
        unit=UNIT_SECONDS,
    )
    max_tier_moves_per_tick: int = setting(
        256, "disk tier: most demotions, promotions or disk evictions started per tick",
        unit="objects",
    )
    tier_exact_scan_objects: int = setting(
        4096, "disk tier: objects in a segment up to which demotion and disk eviction take the "
        "exact coldest (a partial sort each tick); past it each is the coldest of "
        "eviction_samples random picks (master/state/coldest.py)", unit="objects",
    )
    tier_move_timeout_s: float = setting(
        30.0, "disk tier: a move the node has not reported by then is abandoned; at least "
        "heartbeat_interval_s + 1 s (the node skips a move with under 1 s left)",
        unit=UNIT_SECONDS
    )
    eviction_samples: int = setting(
        16, "objects sampled per eviction (approximate LRU), and per demotion or disk eviction "
        "in a segment of over tier_exact_scan_objects (master/state/coldest.py)",
        unit="objects")
    max_evictions_per_put: int = setting(
        64, "most objects one put may evict synchronously to make room", unit="objects"
    )
    max_evictions_per_tick: int = setting(
        20000, "most objects one background eviction tick may evict", unit="objects"
    )
    kv_events_bind: str = setting(
        "", "ZMQ PUB address of the KV events in vLLM's format, tcp://HOST:PORT (empty: off). "
        "ZMQ has no credentials: bind it to a trusted network (docs/events.md)")
    kv_events_replay_bind: str = setting(
        "", "ZMQ ROUTER address answering replay requests by sequence number (empty: the "
        "events port + 1)")
    kv_events_replay_batches: int = setting(
        4096, "event batches kept per tenant for replay and the gRPC stream", unit="batches")
    kv_events_max_streams_per_tenant: int = setting(
        64, "most WatchKvEvents streams open at once per tenant (one more is "
        "RESOURCE_EXHAUSTED)", unit="streams")
    kv_events_queue_batches: int = setting(
        4096, "event batches queued for each subscriber (the PUB socket's high-water mark); "
        "a subscriber further behind misses live batches (still replayable)", unit="batches")
    tick_interval_s: float = setting(
        0.1, "period of the background sweeps (membership, pins, puts, quarantine, eviction)",
        unit=UNIT_SECONDS,
    )
    max_freed_per_heartbeat: int = setting(
        4096, "most freed-range notices returned in one heartbeat reply", unit="ranges"
    )
    max_freed_backlog: int = setting(
        1_000_000, "most unacknowledged freed-range notices kept per node (oldest dropped)",
        unit="ranges",
    )
    max_segments_per_node: int = setting(64, "most segments one node may mount", unit="segments")
    repair_bytes_per_s: int = setting(
        64 << 20, "re-replication and drain pace: most bytes per second one node reads (as a "
        "source) or writes (as a target) for copies of lost replicas (accepts 64MiB)",
        unit=UNIT_BYTES,
    )
    repair_copies_per_heartbeat: int = setting(
        256, "most copy orders one heartbeat reply hands a node", unit="copies"
    )
    grpc_max_message_bytes: int = setting(
        4 << 20, "largest gRPC message the master sends or accepts", unit=UNIT_BYTES
    )
    max_connections_per_peer: int = setting(
        64, "most concurrent fast-line connections from one peer address (more are closed; "
        "their clients use gRPC)", unit="connections"
    )
    idle_timeout_s: float = setting(
        300.0, "a fast-line request's header must arrive within this of the master starting to "
        "wait for it; idle gRPC connections are closed after it too", unit=UNIT_SECONDS
    )
    frame_timeout_s: float = setting(
        10.0, "a fast-line request's body must arrive (and a reply be read) within this",
        unit=UNIT_SECONDS
    )
    max_pending_bytes: int = setting(
        64 << 20, "most request-body bytes the fast line receives at once, all connections "
        "together (a request that does not fit closes its connection)", unit=UNIT_BYTES
    )
    # Ports a stranger cannot block (issue #19): gRPC, HTTP and refusal-log bounds.
    grpc_max_connections: int = setting(
        512, "most concurrent gRPC connections (grpc.max_allowed_incoming_connections); more "
        "are closed at once", unit="connections"
    )
    grpc_handshake_timeout_s: float = setting(
        5.0, "a gRPC connection must finish its TLS/HTTP2 handshake within this, or it is "
        "closed (an idle TCP connection holds nothing)", unit=UNIT_SECONDS
    )
    grpc_max_connection_idle_s: float = setting(
        60.0, "a gRPC connection with no call in flight for this long is closed (GOAWAY; "
        "clients reconnect on their next call)", unit=UNIT_SECONDS
    )
    grpc_max_connection_age_s: float = setting(
        1800.0, "a gRPC connection is closed (GOAWAY) after this long whatever it does, so "
        "none is held forever", unit=UNIT_SECONDS
    )
    grpc_max_connection_age_grace_s: float = setting(
        10.0, "calls in flight when a connection reaches grpc_max_connection_age_s may finish "
        "within this", unit=UNIT_SECONDS
    )
    http_max_connections: int = http_limits.max_connections_setting()
    http_max_connections_per_peer: int = http_limits.max_connections_per_peer_setting()
    http_header_timeout_s: float = http_limits.header_timeout_setting()
    http_tls: bool = http_limits.tls_setting()
    refusal_log_interval_s: float = setting(
        10.0, "at most one log line per peer per this about refused requests, with a count "
        "(every refusal is counted in master_auth_refusals_total)", unit=UNIT_SECONDS
    )
    max_tenant_writing_fraction: float = setting(
        0.5, "most bytes one tenant may hold WRITING (reserved by PutStart, not yet PutEnd), as "
        "a fraction of the cluster's capacity, whatever its quotas", unit="fraction"
    )
    default_tenant_quota_fraction: float = setting(
        0.5, "byte quota of a tenant nobody set one for (admin API or `tenants` without "
        "quota_bytes, or created implicitly), as a fraction of the cluster's capacity; it follows "
        "the capacity. Unlimited is explicit (quota_bytes: 0 or 'unlimited'). 0: no default "
        "(such tenants are unlimited, as before). The `default` tenant is unlimited unless "
        "given a quota_bytes", unit="fraction"
    )
    max_tenants: int = setting(
        10_000, "most tenants, configured, created by the admin API or implicitly", unit="tenants"
    )
    max_status_tenants: int = setting(
        64, "most tenants listed in one ClusterStatus reply (the caller's own first)",
        unit="tenants",
    )
    tenants: dict[str, Any] = setting(
        None, "tenant quotas: {name: {quota_bytes: '4GiB', quota_objects: N, quota_writing_bytes: "
        "'1GiB', hard_pin: false, quota_hard_pin_bytes: '1GiB'}}; 0 = unlimited; without "
        "quota_bytes: default_tenant_quota_fraction of the capacity",
        flag=False, default_factory=dict,
    )
    allow_unknown_tenants: bool = setting(
        False, "accept requests from tenants not configured (created unlimited)"
    )
    etcd: str = setting(
        "", "etcd endpoints HOST:PORT[,HOST:PORT...] for high availability: masters campaign for "
        "leadership there (empty: a single master, no etcd)"
    )
    cluster: str = setting("cellar", "cluster name: keys live under /cellar/<cluster>/ in etcd")
    advertise: str = setting(
        "", "gRPC address HOST:PORT that nodes and clients reach this master at, published in "
        "etcd when it leads (empty: the bound listen address)"
    )
    master_id: str = setting("", "this master's name in etcd (empty: the advertised address)")
    lease_ttl_s: int = setting(
        3, "etcd lease of the leader: a dead leader is replaced after about this long; a leader "
        "cut off from etcd stops serving before it lapses (etcd leases are whole seconds)",
        unit="s (integer)"
    )
    etcd_timeout_s: float = setting(1.0, "deadline of one etcd request", unit=UNIT_SECONDS)

    def validate(self) -> None:
        for name in ("listen", "http"):
            try:
                parse_host_port(getattr(self, name))
            except ValueError as exc:
                raise ConfigError(name, str(exc)) from None
        require(bool(self.tls_cert_file) == bool(self.tls_key_file), "tls_cert_file",
                "tls_cert_file and tls_key_file go together")
        require(not self.http_tls or bool(self.tls_cert_file), "http_tls",
                "an HTTPS port needs this process's certificate (tls_cert_file, tls_key_file)")
        require(bool(self.tls_client_ca_file) == bool(self.node_listen), "node_listen",
                "node_listen and tls_client_ca_file go together")
        require(not self.node_listen or bool(self.tls_cert_file), "node_listen",
                "mutual TLS needs the master's own certificate (tls_cert_file)")
        require(not self.refuse_node_credentials or bool(self.node_listen),
                "refuse_node_credentials", "nodes could not join: set node_listen and "
                "tls_client_ca_file so that they join by certificate")
        require(not self.refuse_node_credentials or not self.etcd, "refuse_node_credentials",
                "an HA master's nodes join with the node credential (mutual TLS to an HA "
                "leader is not built)")
        if self.node_listen:
            try:
                parse_host_port(self.node_listen)
            except ValueError as exc:
                raise ConfigError("node_listen", str(exc)) from None
        require(self.default_replicas >= 1, "default_replicas", "must be >= 1")
        require(1 <= self.max_replicas <= 64, "max_replicas", "must be in [1, 64]")
        require(self.default_replicas <= self.max_replicas, "default_replicas", "must be <= max_replicas")
        require(1 <= self.max_key_bytes <= 1 << 16, "max_key_bytes", "must be in [1, 65536]")
        require(1 <= self.max_batch_keys <= 1 << 16, "max_batch_keys", "must be in [1, 65536]")
        require(1 <= self.max_list_keys <= 1 << 16, "max_list_keys", "must be in [1, 65536]")
        require(0 <= self.max_put_ahead_keys <= 1 << 16, "max_put_ahead_keys", "must be in [0, 65536]")
        require(self.max_put_ahead_dropped_keys >= 0, "max_put_ahead_dropped_keys", "must be >= 0")
        require(self.pin_ttl_s > 0, "pin_ttl_s", "must be > 0")
        require(self.max_pins_per_client >= 1, "max_pins_per_client", "must be >= 1")
        require(self.write_grant_ttl_s > 0, "write_grant_ttl_s", "must be > 0")
        require(self.grant_skew_s >= 0, "grant_skew_s", "must be >= 0")
        require(0 <= self.read_trust_s <= self.pin_ttl_s / 2, "read_trust_s",
                "must be >= 0 and at most half of pin_ttl_s (the grants it reuses must outlive it)")
        require(self.heartbeat_interval_s > 0, "heartbeat_interval_s", "must be > 0")
        require(
            self.node_suspect_after_s > self.heartbeat_interval_s, "node_suspect_after_s",
            "must be greater than heartbeat_interval_s",
        )
        require(
            self.node_expire_after_s > self.node_suspect_after_s, "node_expire_after_s",
            "must be greater than node_suspect_after_s",
        )
        require(self.max_remove_tombstones >= 0, "max_remove_tombstones", "must be >= 0")
        require(self.request_id_memory_entries >= 0, "request_id_memory_entries", "must be >= 0")
        require(self.request_id_memory_s > 0, "request_id_memory_s", "must be > 0")
        require(self.request_id_memory_bytes >= 0, "request_id_memory_bytes", "must be >= 0")
        require(0 <= self.rebuild_grace_s <= 600, "rebuild_grace_s", "must be in [0, 600]")
        require(self.new_node_ramp_s >= 0, "new_node_ramp_s", "must be >= 0")
        require(1 <= self.placement_choices <= 64, "placement_choices", "must be in [1, 64]")
        require(
            0 < self.eviction_low_watermark <= 1, "eviction_low_watermark", "must be in (0, 1]"
        )
        require(
            0 < self.eviction_high_watermark <= 1, "eviction_high_watermark", "must be in (0, 1]"
        )
        require(
            self.eviction_high_watermark >= self.eviction_low_watermark, "eviction_high_watermark",
            f"{self.eviction_high_watermark} is below eviction_low_watermark "
            f"{self.eviction_low_watermark}",
        )
        for low, high in (("demote_low_watermark", "demote_high_watermark"),
                          ("disk_low_watermark", "disk_high_watermark")):
            require(0 < getattr(self, low) <= getattr(self, high) <= 1, high,
                    f"need 0 < {low} <= {high} <= 1")
        require(0 < self.promote_window_s <= 86400, "promote_window_s", "must be in (0, 1 day]")
        require(1 <= self.max_tier_moves_per_tick <= 65536, "max_tier_moves_per_tick",
                "must be in [1, 65536]")
        require(0 <= self.tier_exact_scan_objects <= 1 << 24, "tier_exact_scan_objects",
                "must be in [0, 16777216]")
        least_s = MOVE_DEADLINE_MARGIN_S + self.heartbeat_interval_s
        require(self.tier_move_timeout_s >= least_s, "tier_move_timeout_s",
                f"{self.tier_move_timeout_s:g} s is below the minimum of {least_s:g} s: "
                "heartbeat_interval_s (a move may wait that long for the heartbeat that carries "
                f"it) plus the {MOVE_DEADLINE_MARGIN_S:g} s a node keeps before a move's "
                "deadline (MOVE_DEADLINE_MARGIN_S, proto/tiers.py); every move, or most, would "
                "be skipped")
        require(self.tier_move_timeout_s <= 3600, "tier_move_timeout_s", "must be at most 1 hour")
        require(1 <= self.eviction_samples <= 1024, "eviction_samples", "must be in [1, 1024]")
        require(self.max_evictions_per_put >= 0, "max_evictions_per_put", "must be >= 0")
        require(self.max_evictions_per_tick >= 1, "max_evictions_per_tick", "must be >= 1")
        require(0 < self.tick_interval_s <= 5, "tick_interval_s", "must be in (0, 5]")
        require(self.max_freed_per_heartbeat >= 1, "max_freed_per_heartbeat", "must be >= 1")
        require(self.max_freed_backlog >= 1, "max_freed_backlog", "must be >= 1")
        require(self.max_segments_per_node >= 1, "max_segments_per_node", "must be >= 1")
        require(1 << 10 <= self.repair_bytes_per_s <= 1 << 40, "repair_bytes_per_s",
                "must be in [1KiB, 1TiB] per second")
        require(1 <= self.repair_copies_per_heartbeat <= 4096, "repair_copies_per_heartbeat",
                "must be in [1, 4096]")
        require(0 <= self.fast_port <= 65535, "fast_port", "must be in [0, 65535]")
        require(
            64 << 10 <= self.grpc_max_message_bytes <= 1 << 30, "grpc_max_message_bytes",
            "must be in [64KiB, 1GiB]",
        )
        list_reply_bytes = (self.max_list_keys * (self.max_key_bytes + LIST_KEY_WIRE_OVERHEAD_BYTES)
                            + LIST_REPLY_SLACK_BYTES)
        require(list_reply_bytes <= self.grpc_max_message_bytes, "max_list_keys",
                f"a full page of max_key_bytes keys ({list_reply_bytes} bytes) must fit "
                f"grpc_max_message_bytes ({self.grpc_max_message_bytes}); lower max_list_keys")
        require(1 <= self.max_connections_per_peer <= 65536, "max_connections_per_peer",
                "must be in [1, 65536]")
        require(0.1 <= self.idle_timeout_s <= 86400, "idle_timeout_s", "must be in [0.1s, 1 day]")
        require(0.1 <= self.frame_timeout_s <= 3600, "frame_timeout_s", "must be in [0.1s, 1 hour]")
        require(1 <= self.grpc_max_connections <= 65536, "grpc_max_connections",
                "must be 1..65536")
        for name in ("grpc_handshake_timeout_s", "grpc_max_connection_idle_s",
                     "grpc_max_connection_age_s", "grpc_max_connection_age_grace_s",
                     "refusal_log_interval_s"):
            require(0.1 <= getattr(self, name) <= 86400, name, "must be in [0.1s, 1 day]")
        http_limits.check_limits(self.http_max_connections, self.http_max_connections_per_peer,
                                 self.http_header_timeout_s)
        require(self.max_pending_bytes >= self.grpc_max_message_bytes, "max_pending_bytes",
                "must be at least grpc_max_message_bytes (one largest request)")
        if self.etcd:
            try:
                parse_endpoints(self.etcd)
                check_cluster_name(self.cluster)
            except InvalidArgument as exc:
                raise ConfigError("etcd" if "endpoint" in str(exc) else "cluster", str(exc)) from None
            if self.advertise:
                try:
                    _, advertised_port = parse_host_port(self.advertise)
                except ValueError as exc:
                    raise ConfigError("advertise", str(exc)) from None
                require(advertised_port != 0, "advertise", "must name a real port, not 0")
            require(MIN_LEASE_TTL_S <= self.lease_ttl_s <= MAX_LEASE_TTL_S, "lease_ttl_s",
                    f"must be in [{MIN_LEASE_TTL_S}, {MAX_LEASE_TTL_S}] (etcd's minimum lease)")
            require(0 < self.etcd_timeout_s < self.lease_ttl_s, "etcd_timeout_s",
                    "must be > 0 and shorter than lease_ttl_s")
            require(len(self.master_id) <= 128 and "/" not in self.master_id, "master_id",
                    "must be at most 128 characters, without '/'")
        require(0 < self.max_tenant_writing_fraction <= 1, "max_tenant_writing_fraction",
                "must be in (0, 1]")
        require(0 <= self.default_tenant_quota_fraction <= 1, "default_tenant_quota_fraction",
                "must be in [0, 1]")
        require(1 <= self.max_tenants <= 1_000_000, "max_tenants", "must be in [1, 1000000]")
        require(1 <= self.max_status_tenants <= 10_000, "max_status_tenants",
                "must be in [1, 10000]")
        for name in ("kv_events_bind", "kv_events_replay_bind"):
            value = getattr(self, name)
            require(not value or (value.startswith("tcp://") and ":" in value[6:]), name,
                    "must be tcp://HOST:PORT")
        require(1 <= self.kv_events_replay_batches <= 1_000_000, "kv_events_replay_batches",
                "must be in [1, 1000000]")
        require(1 <= self.kv_events_queue_batches <= 1_000_000, "kv_events_queue_batches",
                "must be in [1, 1000000]")
        require(1 <= self.kv_events_max_streams_per_tenant <= 100_000,
                "kv_events_max_streams_per_tenant", "must be in [1, 100000]")
        if not isinstance(self.tenants, dict):
            raise ConfigError("tenants", "expected a mapping of tenant name to quotas")
        require(len(self.tenants) < self.max_tenants, "tenants",
                f"{len(self.tenants)} tenants configured; max_tenants is {self.max_tenants}")
        for name, raw in self.tenants.items():
            parse_tenant_quota(name, raw)

    def tier_settings(self) -> TierSettings:
        """The disk tier's policy settings (master/state/tiers.py)."""
        return TierSettings(self.demote_high_watermark, self.demote_low_watermark,
                            self.disk_high_watermark, self.disk_low_watermark,
                            self.promote_window_s, self.max_tier_moves_per_tick,
                            self.tier_move_timeout_s, self.pin_ttl_s + self.grant_skew_s,
                            self.eviction_samples, self.tier_exact_scan_objects)

    def tenant_quotas(self) -> dict[str, TenantQuota]:
        """The configured tenants, parsed; `default` is always present."""
        quotas = {name: parse_tenant_quota(name, raw) for name, raw in self.tenants.items()}
        quotas.setdefault(DEFAULT_TENANT, TenantQuota())
        return quotas
