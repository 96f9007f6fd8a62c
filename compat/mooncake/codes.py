"""Mooncake's integer return codes and the one table that maps Cellar outcomes onto them.

What it owns
    `ErrorCode`, the subset of Mooncake Store's `ErrorCode` numbers (mooncake-store
    `types.h`) that `cellar.compat.mooncake` can return, and `code_for`, the only place that
    turns a Cellar per-key `Status` or a raised `cellar` exception into one of them. Every
    method of `MooncakeDistributedStore` reports failures through `code_for`, so a caller that
    switches on Mooncake's numbers sees the same number for the same cause everywhere.

Why a table and not the exceptions
    Cellar itself raises typed exceptions (STYLE.md: "error results as negative integers" is
    what we avoid). This room exists to speak Mooncake's API to code that cannot change, so
    here, and only here, outcomes become integers.

What it must never do
    Invent a success: an outcome the table does not know is INTERNAL_ERROR (-1), never 0.
"""

from __future__ import annotations

import enum

from cellar.errors import (
    BufferTooSmall,
    CellarError,
    IntegrityError,
    Status,
    Timeout,
    Unavailable,
)


class ErrorCode(enum.IntEnum):
    """Mooncake's numbers (same names) for the outcomes Cellar can produce."""

    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    NO_AVAILABLE_HANDLE = -200
    INVALID_KEY = -400
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    LEASE_EXPIRED = -707
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    NOT_SUPPORTED = -1012
    TENANT_QUOTA_EXCEEDED = -1700


# The one table. A per-key Status comes from a batched reply; an exception class is what a
# single-key call raised. Exceptions whose meaning is narrower than their `status` attribute
# (a Timeout carries UNAVAILABLE, an IntegrityError INTERNAL) have their own row, looked up
# first along the class's MRO.
_BY_STATUS: dict[Status, ErrorCode] = {
    Status.OK: ErrorCode.OK,
    Status.NOT_FOUND: ErrorCode.OBJECT_NOT_FOUND,
    Status.ALREADY_EXISTS: ErrorCode.OBJECT_ALREADY_EXISTS,
    Status.NO_SPACE: ErrorCode.NO_AVAILABLE_HANDLE,        # no segment could place it
    Status.QUOTA_EXCEEDED: ErrorCode.TENANT_QUOTA_EXCEEDED,
    Status.NOT_READY: ErrorCode.REPLICA_IS_NOT_READY,      # still being written
    Status.INVALID: ErrorCode.INVALID_PARAMS,
    Status.UNAVAILABLE: ErrorCode.TRANSFER_FAIL,           # per key: no replica reachable
    Status.PERMISSION_DENIED: ErrorCode.ILLEGAL_CLIENT,
    Status.EXPIRED: ErrorCode.LEASE_EXPIRED,
    Status.INTERNAL: ErrorCode.INTERNAL_ERROR,
}
_BY_EXCEPTION: dict[type[CellarError], ErrorCode] = {
    Timeout: ErrorCode.RPC_TIMEOUT,
    Unavailable: ErrorCode.RPC_FAIL,                       # raised: the master is unreachable
    IntegrityError: ErrorCode.CHECKSUM_MISMATCH,
    BufferTooSmall: ErrorCode.INVALID_PARAMS,              # what Mooncake returns for it too
}

TABLE_ROWS: tuple[tuple[str, ErrorCode], ...] = (
    *((f"Status.{st.name}", code) for st, code in _BY_STATUS.items()),
    *((f"raised {cls.__name__}", code) for cls, code in _BY_EXCEPTION.items()),
)
"""The table as (Cellar outcome, Mooncake code) rows, for docs/mooncake.md and the tests."""


def code_for(outcome: Status | int | BaseException) -> int:
    """Mooncake's code for a Cellar per-key status or a raised exception."""
    if isinstance(outcome, BaseException):
        for cls in type(outcome).__mro__:
            code = _BY_EXCEPTION.get(cls)  # type: ignore[call-overload]
            if code is not None:
                return int(code)
        if isinstance(outcome, CellarError):
            return int(_BY_STATUS.get(outcome.status, ErrorCode.INTERNAL_ERROR))
        if isinstance(outcome, (ValueError, TypeError, OverflowError)):
            return int(ErrorCode.INVALID_PARAMS)  # bad Python arguments, refused before I/O
        return int(ErrorCode.INTERNAL_ERROR)
    try:
        return int(_BY_STATUS.get(Status(outcome), ErrorCode.INTERNAL_ERROR))
    except ValueError:
        return int(ErrorCode.INTERNAL_ERROR)


def put_code(outcome: Status | int | BaseException) -> int:
    """A put's code: Mooncake counts "the key already exists" as success (a cache put)."""
    code = code_for(outcome)
    return 0 if code == ErrorCode.OBJECT_ALREADY_EXISTS else code
