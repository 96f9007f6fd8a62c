"""Requests: what a master RPC takes in, and the checks every value from the network passes.

Owns the plain input types (`PutItem`, `PutEndItem`, `PutRef`: stand-ins for the protobuf
messages in tests, which the service reads duck-typed through the `*Like` protocols), the
whole-request refusal (`RequestRejected`), the clock protocol, and the validators: key bytes,
batch sizes, and the integer ranges of ids, sizes and offsets (a protobuf uint64 can carry
2^64-1; nothing from the wire is used before it is checked against the range it must lie in).

Invariant: a validator never mutates state; a refused request changes nothing stored.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cellar.master.state.ids import MAX_ID

MAX_AVOID_NODES = 256
MAX_PREFERRED_HOST_CHARS = 256
MAX_SOFT_PIN_TTL_MS = 7 * 24 * 3600 * 1000  # a week: a soft pin is a cache priority, not storage


class RequestRejected(Exception):
    """The whole request is refused; `code` names a grpc.StatusCode member."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def wall_ms(self) -> int: ...


class SystemClock:
    @staticmethod
    def monotonic() -> float:
        return time.monotonic()

    @staticmethod
    def wall_ms() -> int:
        return time.time_ns() // 1_000_000


# ---------------------------------------------------------------- plain inputs (tests)


@dataclass
class PutItem:
    key: str
    size_bytes: int
    replicas: int = 0
    soft_pin: bool = False
    hard_pin: bool = False
    upsert: bool = False
    preferred_host_id: str = ""
    avoid_node_ids: Sequence[str] = field(default_factory=list)
    soft_pin_ttl_ms: int = 0
    engine_hash: bytes = b""


@dataclass
class PutEndItem:
    key: str
    put_id: int
    checksum: int = 0
    receipts: Sequence[bytes] = ()  # one node receipt per replica (master/receipts.py)
    bind: PutItem | None = None     # a put-ahead allocation's put fields (master/put_ahead.py)


@dataclass
class PutAheadAsk:
    count: int
    size_bytes: int
    replicas: int = 0


@dataclass
class PutRef:
    key: str
    put_id: int


class PutItemLike(Protocol):
    key: str
    size_bytes: int
    replicas: int
    soft_pin: bool
    hard_pin: bool
    upsert: bool
    preferred_host_id: str
    avoid_node_ids: Sequence[str]
    soft_pin_ttl_ms: int
    engine_hash: bytes


class PutEndLike(Protocol):
    key: str
    put_id: int
    checksum: int
    receipts: Sequence[bytes]


class PutRefLike(Protocol):
    key: str
    put_id: int


class PutAheadAskLike(Protocol):
    count: int
    size_bytes: int
    replicas: int


# ---------------------------------------------------------------- validators


def key_error(key: str, max_key_bytes: int) -> str:
    """Why `key` is not acceptable, or '' (strings off the wire are already valid UTF-8)."""
    if not key:
        return "empty key"
    if key.isascii():
        nbytes = len(key)
    else:
        try:
            nbytes = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            return "key is not valid UTF-8 (lone surrogate)"
    if nbytes > max_key_bytes:
        return f"key is {nbytes} bytes, over max_key_bytes ({max_key_bytes} bytes UTF-8)"
    if "\x00" in key:
        return "key contains a NUL character"
    return ""


def check_key_bound(what: str, text: str, max_key_bytes: int) -> None:
    """Refuse a prefix or bound (RemovePrefix, ListKeys) longer than any key could be."""
    nbytes = len(text.encode("utf-8", "surrogatepass"))
    if nbytes > max_key_bytes:
        raise RequestRejected(f"{what} is {nbytes} bytes, over max_key_bytes ({max_key_bytes} bytes UTF-8)")


def check_batch(count: int, max_batch_keys: int, what: str = "keys") -> None:
    if count > max_batch_keys:
        raise RequestRejected(f"batch of {count} {what} is over max_batch_keys ({max_batch_keys})")


def valid_id(value: object) -> bool:
    """Whether an id off the wire (alloc, put, pin, segment) lies in 1..MAX_ID."""
    return type(value) is int and 0 < value <= MAX_ID


def range_error(offset: object, length: object, size_bytes: int) -> str:
    """Why [offset, offset+length) is not inside a segment of `size_bytes`, or ''."""
    if type(offset) is not int or type(length) is not int:
        return "offset and length must be integers"
    if length <= 0:
        return f"length {length} must be > 0"
    if offset < 0 or offset >= size_bytes or length > size_bytes - offset:
        return f"range [{offset}, +{length}) is outside the segment ({size_bytes} bytes)"
    return ""
