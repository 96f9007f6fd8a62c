"""`ReplicateConfig` and `SoftPinAction`, Mooncake's per-write options, and what Cellar makes of them.

What it owns
    `SoftPinAction` (PRESERVE, ENABLE, DISABLE: Mooncake's numbers), `ReplicateConfig` with
    every field of Mooncake 0.3.13's (replica_num, nof_replica_num, dfs_replica_num,
    soft_pin_action, soft_pin_ttl_ms, with_hard_pin, preferred_segment, preferred_segments,
    preferred_nof_segments, prefer_alloc_in_same_node, data_type, group_ids) plus the older
    with_soft_pin, and `write_options`, which turns one into the SDK's put arguments
    (`WriteOptions`) or refuses it with Mooncake's code.

What Cellar honours (docs/mooncake.md has the table)
    - replica_num: that many copies on distinct nodes.
    - soft_pin_action ENABLE: soft-pinned (evicted only in the master's second pass) until
      soft_pin_ttl_ms lapses (Mooncake's default of 30 minutes when omitted; 0 is ordinary
      cache; above 24 hours is INVALID_PARAMS, Mooncake's default maximum); reads do not
      extend it. A TTL with PRESERVE or DISABLE is INVALID_PARAMS, as Mooncake's master says.
      DISABLE and PRESERVE write an ordinary object (an upsert replaces the value, pin state
      included). The older with_soft_pin is a soft pin that does not lapse.
    - with_hard_pin: never evicted (the tenant needs Cellar's hard-pin right; without it the
      write fails ILLEGAL_CLIENT).
    - preferred_segment(s) and prefer_alloc_in_same_node: a placement preference the master
      honours when the host has room: the first replica goes to a node on the preferred
      segment's host (`MooncakeDistributedStore` resolves the segment name to a host id).
    - data_type and group_ids are accepted: Cellar stores no type label and keeps routing,
      leases and eviction per object (Mooncake applies groups best-effort too).

What it refuses (NOT_SUPPORTED, -1012)
    nof_replica_num > 0 and preferred_nof_segments (no NVMe-oF pool), dfs_replica_num > 0 (no
    shared-filesystem replica). Cellar's disk tier is below each node's DRAM and is filled by
    demotion, never asked for per write.

What it must never do
    Accept an option that changes where or how long Mooncake keeps an object and then ignore it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from cellar.compat.mooncake.codes import ErrorCode

MAX_REPLICAS = 16   # far above any cluster's node count; bounds garbage input
DEFAULT_SOFT_PIN_TTL_MS = 30 * 60 * 1000    # Mooncake master's default_kv_soft_pin_ttl
MAX_SOFT_PIN_TTL_MS = 24 * 60 * 60 * 1000   # Mooncake master's default max_kv_soft_pin_ttl
MAX_GROUP_ID_CHARS = 1024
_U64 = 1 << 64


class SoftPinAction(enum.IntEnum):
    """The soft-pin transition a write requests (Mooncake's values)."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicateConfig:
    """Per-write options; attribute names, defaults and type checks as Mooncake's binding
    (an attribute it does not have raises AttributeError; a bad soft_pin_ttl_ms TypeError)."""

    __slots__ = ("replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_action",
                 "soft_pin_ttl_ms", "with_hard_pin", "preferred_segment", "preferred_segments",
                 "preferred_nof_segments", "prefer_alloc_in_same_node", "data_type", "group_ids",
                 "with_soft_pin")

    def __init__(self) -> None:
        self.replica_num = 1
        self.nof_replica_num = 0
        self.dfs_replica_num = 0
        self.soft_pin_action = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms: int | None = None
        self.with_hard_pin = False
        self.preferred_segment = ""
        self.preferred_segments: list[str] = []
        self.preferred_nof_segments: list[str] = []
        self.prefer_alloc_in_same_node = False
        self.data_type = 0  # Mooncake's ObjectDataType.UNKNOWN
        self.group_ids: list[str] | None = None
        self.with_soft_pin = False  # Mooncake <= 0.3.12; ENABLE without a lapse here

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "soft_pin_ttl_ms" and value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U64):
            raise TypeError(f"soft_pin_ttl_ms must be None or an int in [0, 2**64), "
                            f"got {value!r}")
        if name == "soft_pin_action" and not isinstance(value, SoftPinAction):
            try:
                value = SoftPinAction(value)
            except ValueError:
                raise TypeError(f"soft_pin_action must be a SoftPinAction, got {value!r}") from None
        object.__setattr__(self, name, value)

    def __str__(self) -> str:
        ttl = "default" if self.soft_pin_ttl_ms is None else self.soft_pin_ttl_ms
        return (f"ReplicateConfig: {{ replica_num: {self.replica_num}, "
                f"nof_replica_num: {self.nof_replica_num}, "
                f"dfs_replica_num: {self.dfs_replica_num}, "
                f"soft_pin_action: {self.soft_pin_action.name}, soft_pin_ttl_ms: {ttl}, "
                f"with_hard_pin: {self.with_hard_pin}, "
                f"preferred_segments: [{', '.join(self.segments())}], "
                f"prefer_alloc_in_same_node: {self.prefer_alloc_in_same_node} }}")

    __repr__ = __str__

    def segments(self) -> list[str]:
        """The preferred segments in order (the deprecated single one first)."""
        first = [self.preferred_segment] if self.preferred_segment else []
        return first + [s for s in self.preferred_segments if s and s not in first]


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """What the SDK is asked for: replicas, soft pin (and when it lapses: 0 = never), hard pin,
    and the Mooncake segment names whose host should take the first replica ("" for none;
    `local` for prefer_alloc_in_same_node)."""

    replicas: int = 1
    soft_pin: bool = False
    soft_pin_ttl_ms: int = 0
    hard_pin: bool = False
    preferred_segments: tuple[str, ...] = ()
    local: bool = False


class OptionError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _count(config: ReplicateConfig, name: str, low: int, high: int) -> int:
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise OptionError(ErrorCode.INVALID_PARAMS, f"{name} must be {low}..{high}")
    return value


def write_options(config: ReplicateConfig | None, keys: int = 1) -> WriteOptions:
    """The SDK's options for a write of `keys` keys; OptionError with the code otherwise."""
    if config is None:
        return WriteOptions()
    if not isinstance(config, ReplicateConfig):
        raise OptionError(ErrorCode.INVALID_PARAMS,
                          f"config must be a ReplicateConfig, not {type(config).__name__}")
    replicas = _count(config, "replica_num", 1, MAX_REPLICAS)
    if _count(config, "nof_replica_num", 0, MAX_REPLICAS) or config.preferred_nof_segments:
        raise OptionError(ErrorCode.NOT_SUPPORTED,
                          "nof_replica_num/preferred_nof_segments: Cellar has no NVMe-oF pool")
    if _count(config, "dfs_replica_num", 0, 1):
        raise OptionError(ErrorCode.NOT_SUPPORTED,
                          "dfs_replica_num: Cellar has no shared-filesystem replica")
    if config.group_ids is not None and (
            len(config.group_ids) != keys
            or any(not isinstance(g, str) or len(g) > MAX_GROUP_ID_CHARS for g in config.group_ids)):
        raise OptionError(ErrorCode.INVALID_PARAMS, f"group_ids must hold {keys} strings")
    action, ttl = config.soft_pin_action, config.soft_pin_ttl_ms
    if ttl is not None and action != SoftPinAction.ENABLE:
        raise OptionError(ErrorCode.INVALID_PARAMS, "soft_pin_ttl_ms is valid only with ENABLE")
    if ttl is not None and ttl > MAX_SOFT_PIN_TTL_MS:
        raise OptionError(ErrorCode.INVALID_PARAMS,
                          f"soft_pin_ttl_ms above the maximum ({MAX_SOFT_PIN_TTL_MS})")
    if action == SoftPinAction.ENABLE:
        ttl_ms = DEFAULT_SOFT_PIN_TTL_MS if ttl is None else ttl
        soft_pin = ttl_ms > 0  # an explicit 0 commits the object as ordinary cache
    else:
        soft_pin, ttl_ms = bool(config.with_soft_pin) and action == SoftPinAction.PRESERVE, 0
    hard_pin = bool(config.with_hard_pin)
    if hard_pin and soft_pin:
        soft_pin, ttl_ms = False, 0  # a hard pin is stronger: never evicted
    local = bool(config.prefer_alloc_in_same_node)
    if local and replicas != 1:
        raise OptionError(ErrorCode.INVALID_PARAMS,
                          "prefer_alloc_in_same_node needs replica_num == 1")
    return WriteOptions(replicas, soft_pin, ttl_ms if soft_pin else 0, hard_pin,
                        tuple(config.segments()), local)
