"""`ReplicateConfig`, Mooncake's per-write options, and what Cellar makes of them.

What it owns
    `ReplicateConfig` (same attribute names as Mooncake 0.3.x: replica_num, with_soft_pin,
    with_hard_pin, preferred_segment, preferred_segments, prefer_alloc_in_same_node) and
    `write_options`, which turns one into the SDK's `replicas=` and `soft_pin=` or refuses it.

What Cellar honours
    replica_num (>= 1: that many copies on distinct nodes) and with_soft_pin (evicted only in
    the second pass). A hard pin, a preferred segment and local-first allocation have no
    Cellar equivalent (the master places every replica), so a write that asks for one returns
    NOT_SUPPORTED instead of silently doing something else.

What it must never do
    Accept an option it then ignores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cellar.compat.mooncake.codes import ErrorCode

MAX_REPLICAS = 16   # far above any cluster's node count; bounds garbage input


@dataclass(slots=True)
class ReplicateConfig:
    """Per-write options; attribute names and defaults as in Mooncake."""

    replica_num: int = 1
    with_soft_pin: bool = False
    with_hard_pin: bool = False
    preferred_segment: str = ""
    preferred_segments: list[str] = field(default_factory=list)
    prefer_alloc_in_same_node: bool = False

    def __str__(self) -> str:
        return (f"ReplicateConfig: {{ replica_num: {self.replica_num}, "
                f"with_soft_pin: {self.with_soft_pin}, with_hard_pin: {self.with_hard_pin} }}")


class OptionError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def write_options(config: ReplicateConfig | None) -> tuple[int, bool]:
    """(replicas, soft_pin) for the SDK; OptionError with the code to return otherwise."""
    if config is None:
        return 1, False
    if not isinstance(config, ReplicateConfig):
        raise OptionError(ErrorCode.INVALID_PARAMS,
                          f"config must be a ReplicateConfig, not {type(config).__name__}")
    replicas = config.replica_num
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= MAX_REPLICAS:
        raise OptionError(ErrorCode.INVALID_PARAMS, f"replica_num must be 1..{MAX_REPLICAS}")
    if config.with_hard_pin:
        raise OptionError(ErrorCode.NOT_SUPPORTED, "with_hard_pin: Cellar has no hard pin for clients")
    if config.preferred_segment or config.preferred_segments:
        raise OptionError(ErrorCode.NOT_SUPPORTED, "preferred_segment: the Cellar master places replicas")
    if config.prefer_alloc_in_same_node:
        raise OptionError(ErrorCode.NOT_SUPPORTED,
                          "prefer_alloc_in_same_node: the Cellar master places replicas")
    return replicas, bool(config.with_soft_pin)
