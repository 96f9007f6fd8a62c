"""Argument checks and the client's own limits: everything a face must refuse before a byte
or an RPC leaves, shared by `Client` and `AsyncClient`.

What it owns
    The SDK's named limits (keys, batches, replicas, retries, budgets), validation of every
    public argument into the plain values the state machines take (`InvalidArgument` names
    the bad one), the transport-name rule of `connect(transport=...)`, batching of key lists,
    how much of a deadline one transfer round may spend, and the object checksum.

What it must never do
    Touch the network or block; accept an argument it cannot name a limit for.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from cellar.advice import check_rate
from cellar.client.buffers import readable_view
from cellar.errors import InvalidArgument
from cellar.proto.keys import all_plain_keys
from cellar.transfer.base import ST_CONNECT_FAILED, ST_CONNECTION_LOST, ST_TIMEOUT
from cellar.transfer.spin_wait import DEFAULT_SPIN_US, MAX_SPIN_US, SPIN_ENV

# ---- limits -------------------------------------------------------------------------------

DEFAULT_MAX_KEY_BYTES = 1024       # used until the master's ClusterStatus says otherwise
DEFAULT_MAX_BATCH_KEYS = 1024
DEFAULT_MAX_LIST_KEYS = 1000       # keys in one ListKeys page, until ClusterStatus says otherwise
MAX_LIST_ALL_KEYS = 1_000_000      # keys `list_all_keys` collects; more is InvalidArgument
MAX_TENANT_BYTES = 255
MAX_REPLICAS = 16
MAX_PUT_ATTEMPTS = 3               # first try + two retries on other nodes
MAX_UNPINS_PER_CALL = 4096         # pin ids piggybacked on one GetReplicas / sent in one Unpin
MAX_QUEUED_UNPINS = 8192           # beyond this the caller flushes synchronously
UNPIN_DELAY_S = 0.1                # a queued pin is released within about this long
UNPIN_FLUSH_TIMEOUT_S = 5.0        # one Unpin call of queued releases (both faces)
CLOSE_FLUSH_TIMEOUT_S = 1.0        # ... made while a client closes
CLOSE_FLUSH_MAX_CALLS = 8          # Unpin calls a closing client makes at most
NODE_UNHEALTHY_S = 3.0             # after a transfer failure, try other replicas first this long
DISK_READ_PRIOR_BYTES_PER_S = float(1 << 30)  # a disk tier not measured yet (optimistic)
DISK_READ_LATENCY_S = 0.0005       # added to every disk-read estimate (seek, syscall, reply)
DISK_RATE_WEIGHT = 0.3             # how far one read round moves a node's disk-rate estimate
MIN_DISK_ROUND_S = 1e-4            # a round shorter than this counts as this long
MAX_DISK_RATE_NODES = 4096         # nodes whose disk rate a client remembers
MIN_RETRY_BUDGET_S = 0.05          # no put retry when less time than this is left
ATTEMPT_SHARE = 0.5                # a transfer that can still fall back gets this share ...
MIN_ATTEMPT_S = 1.0                # ... of the time left, but at least this long
MAX_BUDGET_S = 1e6                 # a get budget beyond this is the same as this

# Transfer statuses that say "the node could not be reached", as opposed to "it refused".
NODE_TROUBLE = frozenset({ST_CONNECT_FAILED, ST_CONNECTION_LOST, ST_TIMEOUT})

# Transport names `connect(transport=...)` accepts, and what "auto" tries, best first.
KNOWN_TRANSPORTS = ("tcp", "shm", "rdma")
# "auto": per replica the first that can reach it: shm (same host, file opens), rdma (a device
# here and on the node), tcp. A forced name uses only that transport: a replica it cannot
# reach fails (ST_CONNECT_FAILED "no transport reaches node ..."), so a benchmark of "shm"
# never silently measures tcp.
AUTO_TRANSPORTS = ("shm", "rdma", "tcp")

@dataclass(frozen=True, slots=True)
class Limits:
    """What the master enforces, learned from ClusterStatus at connect."""

    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES
    max_batch_keys: int = DEFAULT_MAX_BATCH_KEYS
    max_object_bytes: int = 0  # the largest object placeable when we asked (0 = unknown)
    max_list_keys: int = DEFAULT_MAX_LIST_KEYS

    @classmethod
    def from_status(cls, reply: Any) -> Limits:
        return cls(
            max_key_bytes=int(reply.max_key_bytes) or DEFAULT_MAX_KEY_BYTES,
            max_batch_keys=int(reply.max_batch_keys) or DEFAULT_MAX_BATCH_KEYS,
            max_object_bytes=int(reply.max_object_bytes),
            max_list_keys=int(reply.max_list_keys) or DEFAULT_MAX_LIST_KEYS,
        )


# ---- argument validation ------------------------------------------------------------------

def validate_key(key: Any, max_key_bytes: int, what: str = "key") -> str:
    if isinstance(key, str) and not key:
        raise InvalidArgument(f"{what} must not be empty")
    return validate_text(key, max_key_bytes, what)


def validate_text(text: Any, max_bytes: int, what: str) -> str:
    """A str (empty allowed) of at most `max_bytes` UTF-8 bytes: a key, a prefix, a bound."""
    if not isinstance(text, str):
        raise InvalidArgument(f"{what} must be a str, not {type(text).__name__}")
    try:
        nbytes = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} is not valid Unicode (lone surrogate?)") from None
    if nbytes > max_bytes:
        raise InvalidArgument(f"{what} is {nbytes} bytes in UTF-8, over the limit of {max_bytes}")
    return text


def validate_keys(keys: Any, max_key_bytes: int) -> list[str]:
    """A list of valid keys from any iterable of str (a lone str is refused, not iterated)."""
    if isinstance(keys, (str, bytes, bytearray, memoryview)) or not isinstance(keys, Iterable):
        raise InvalidArgument(f"keys must be a sequence of str, not {type(keys).__name__}")
    names = list(keys)
    if all_plain_keys(names, max_key_bytes):  # the common batch, in C loops (proto/keys.py)
        return names
    return [validate_key(k, max_key_bytes, f"keys[{i}]") for i, k in enumerate(names)]


MAX_ESTIMATE_BYTES = 1 << 50  # bytes one load estimate may be asked about (1 PiB)


def validate_nbytes(nbytes: Any) -> int:
    """A byte count in 0..MAX_ESTIMATE_BYTES (bool refused)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) \
            or not 0 <= nbytes <= MAX_ESTIMATE_BYTES:
        raise InvalidArgument(f"nbytes must be an int in 0..{MAX_ESTIMATE_BYTES} (bytes), got "
                              f"{nbytes!r}")
    return nbytes


def validate_tokens_per_key(tokens_per_key: Any) -> int | None:
    """None (unknown) or the tokens one key stands for, 1..MAX_TOKENS_PER_KEY."""
    if tokens_per_key is not None:
        check_rate(None, tokens_per_key)
    return tokens_per_key  # type: ignore[no-any-return]


def validate_replicas(replicas: Any) -> int:
    return validate_count(replicas, MAX_REPLICAS, "replicas")


def validate_count(value: Any, maximum: int, what: str) -> int:
    """An int (not a bool) in 1..maximum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an int, not {type(value).__name__}")
    if not 1 <= value <= maximum:
        raise InvalidArgument(f"{what} must be between 1 and {maximum}, got {value}")
    return value


def validate_value(value: Any, what: str = "value") -> memoryview:
    """A put source as a flat byte view; zero-length values are refused.

    Cellar stores no empty objects: an object is one contiguous range per replica, and an empty
    range could not be placed, recorded in a node's index or rebuilt after a master restart.
    """
    view = readable_view(value, what)
    if view.nbytes == 0:
        raise InvalidArgument(f"{what} is empty; Cellar stores values of at least 1 byte")
    return view


def normalize_items(items: Any, max_key_bytes: int) -> list[tuple[str, memoryview]]:
    """`put_many` items (a mapping or a sequence of (key, value) pairs) as checked pairs."""
    if isinstance(items, Mapping):
        pairs: Iterable[Any] = items.items()
    elif isinstance(items, (str, bytes, bytearray, memoryview)) or not isinstance(items, Iterable):
        raise InvalidArgument(
            f"items must be a mapping or a sequence of (key, value) pairs, not {type(items).__name__}")
    else:
        pairs = items
    out: list[tuple[str, memoryview]] = []
    seen: set[str] = set()
    for i, pair in enumerate(pairs):
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidArgument(f"items[{i}] must be a (key, value) pair")
        key = validate_key(pair[0], max_key_bytes, f"items[{i}] key")
        if key in seen:
            raise InvalidArgument(f"items[{i}]: key {key!r} appears twice in one batch")
        seen.add(key)
        out.append((key, validate_value(pair[1], f"value of {key!r}")))
    return out


def validate_tenant(tenant: Any) -> str:
    if not isinstance(tenant, str) or not tenant:
        raise InvalidArgument("tenant must be a non-empty str")
    if len(tenant.encode(errors="replace")) > MAX_TENANT_BYTES:
        raise InvalidArgument(f"tenant is over {MAX_TENANT_BYTES} bytes")
    return tenant


def validate_timeout(timeout_s: Any) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise InvalidArgument(f"timeout_s must be a number, not {type(timeout_s).__name__}")
    if not 0 < timeout_s < 1e6:
        raise InvalidArgument(f"timeout_s must be positive, got {timeout_s}")
    return float(timeout_s)


def transport_names(choice: Any) -> tuple[str, ...]:
    """The transports to open for `connect(transport=choice)`, in preference order."""
    if not isinstance(choice, str):
        raise InvalidArgument(f"transport must be a str, not {type(choice).__name__}")
    if choice == "auto":
        return AUTO_TRANSPORTS
    if choice in KNOWN_TRANSPORTS:
        return (choice,)
    raise InvalidArgument(
        f"unknown transport {choice!r}; use 'auto' or one of {', '.join(KNOWN_TRANSPORTS)}")


def batch_ranges(count: int, max_batch: int) -> Iterator[range]:
    """Index ranges covering [0, count) in order, each at most max_batch long."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    for start in range(0, count, max_batch):
        yield range(start, min(start + max_batch, count))


def attempt_budget_s(remaining_s: float, can_fall_back: bool) -> float:
    """Time one transfer round may take: all that is left, or a share of it when another
    replica or node could still be tried, so one stalled node cannot eat the whole deadline."""
    if not can_fall_back:
        return remaining_s
    return min(remaining_s, max(MIN_ATTEMPT_S, remaining_s * ATTEMPT_SHARE))


def checksum(view: memoryview) -> int:
    """The object checksum recorded at PutEnd and verified on every read."""
    return xxhash.xxh3_64_intdigest(view)




def validate_budget(timeout_s: Any) -> float | None:
    """A deadline-bounded get's budget: None (the call's own timeout), 0 (return at once) or a
    positive number of seconds; negative, NaN or non-numbers -> InvalidArgument."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise InvalidArgument(f"timeout_s must be a number or None, not {type(timeout_s).__name__}")
    if math.isnan(timeout_s) or timeout_s < 0:
        raise InvalidArgument(f"timeout_s must be >= 0, got {timeout_s}")
    return float(min(timeout_s, MAX_BUDGET_S))


TOKEN_ENV = "CELLAR_TOKEN"


def resolve_token(address: str, token: Any) -> str:
    """The credential to send: `token`, else $CELLAR_TOKEN, else the token file `cellar up`
    wrote for `address` (`cellar.credentials.default_token`), else none ("")."""
    if token is not None:
        if not isinstance(token, str):
            raise InvalidArgument(f"token must be a str or None, not {type(token).__name__}")
        return token
    env = os.environ.get(TOKEN_ENV)
    if env:
        return env
    from cellar.credentials import default_token

    found = default_token(address)
    return found if isinstance(found, str) else ""


def int_from_env(name: str, default: int, limit: int, unit: str) -> int:
    """$`name` as an integer in 0..`limit` (`default` when unset or blank);
    `cellar.InvalidArgument` naming the variable, its range and `unit` for anything else."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= limit:
        raise InvalidArgument(f"${name} must be an integer 0..{limit} ({unit}), got {text!r}")
    return value


def spin_us_from_env() -> int:
    """The SDK's spin window in microseconds (transfer/spin_wait.py) from $CELLAR_SPIN_US,
    DEFAULT_SPIN_US when unset; `cellar.InvalidArgument` for anything but an integer in
    0..MAX_SPIN_US (0: never spin)."""
    return int_from_env(SPIN_ENV, DEFAULT_SPIN_US, MAX_SPIN_US, "microseconds")
