"""Per-key statuses and master RPC failures as `cellar` exceptions (one mapping, both faces).

What it owns
    The per-key result codes a batched get hands back (`MISS`, `LATE`), which statuses count
    as a miss, the status -> exception mapping, and the gRPC code -> exception mapping used for
    gRPC and fast-line replies alike (UNAUTHENTICATED -> `Unauthenticated`, PERMISSION_DENIED ->
    `PermissionDenied`).

What it must never do
    Decide retries (that is the channel's business) or swallow a status it does not know: an
    unknown one becomes INTERNAL.
"""

from __future__ import annotations

from typing import Any

import grpc

from cellar.errors import (
    AlreadyExists,
    CellarError,
    InvalidArgument,
    NoSpace,
    NotFound,
    NotReady,
    PermissionDenied,
    QuotaExceeded,
    Status,
    Timeout,
    Unavailable,
    error_for_status,
)

try:  # sec-identity adds it to cellar.errors; until that lands the SDK defines it here
    from cellar.errors import Unauthenticated  # type: ignore[attr-defined]
except ImportError:
    class Unauthenticated(PermissionDenied):  # type: ignore[no-redef]
        """The master did not accept the credential (missing, unknown or expired token)."""


class ClientClosed(CellarError):
    """A call on a `Client` / `AsyncClient` after `close()`."""

MISS = -1   # a batched `_into` get's result for a key that is not there
LATE = -2   # ... for a key not read within the call's budget (`timeout_s`)

# Per-key statuses a batched get reports as a miss (None / -1) rather than raising.
MISS_STATUSES = frozenset({Status.NOT_FOUND, Status.NOT_READY, Status.UNAVAILABLE,
                           Status.EXPIRED})



_STATUS_BY_VALUE: dict[Any, Status] = dict(Status._value2member_map_)  # type: ignore[arg-type]


def to_status(value: int) -> Status:
    # One dict lookup: Status(value) costs ~0.8 us through the enum machinery, per key.
    try:
        return _STATUS_BY_VALUE[value]
    except (KeyError, TypeError):
        pass
    try:
        return Status(value)
    except ValueError:
        return Status.INTERNAL


def status_error(status: int, message: str = "", key: str | None = None) -> CellarError:
    """The exception a non-OK per-key status stands for, naming the key."""
    st = to_status(status)
    text = message or st.name.lower().replace("_", " ")
    if key is not None:
        text = f"{key!r}: {text}"
    return error_for_status(st, text)


_GRPC_ERRORS: dict[grpc.StatusCode, type[CellarError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Timeout,
    grpc.StatusCode.CANCELLED: Unavailable,
    grpc.StatusCode.FAILED_PRECONDITION: NotReady,
}


def grpc_error(method: str, address: str, code: grpc.StatusCode | None, details: str) -> CellarError:
    """The exception for a failed master RPC; keeps the server's message."""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        cls: type[CellarError] = NoSpace if "space" in details.lower() else QuotaExceeded
        if "message" in details.lower() and "larger than" in details.lower():
            cls = InvalidArgument  # gRPC's own message size limit
    else:
        cls = _GRPC_ERRORS.get(code, CellarError) if code is not None else CellarError
    if code == grpc.StatusCode.INVALID_ARGUMENT and details:
        return cls(details)
    name = code.name if code is not None else "UNKNOWN"
    return cls(f"{method} to master {address}: {name}" + (f": {details}" if details else ""))


def retryable_grpc(code: grpc.StatusCode | None) -> bool:
    """Codes that mean 'the master was not reached (yet)': connection refused, restarting."""
    return code == grpc.StatusCode.UNAVAILABLE




def check_result_count(method: str, got: int, sent: int) -> None:
    if got != sent:
        raise CellarError(f"{method}: master returned {got} results for {sent} keys")
