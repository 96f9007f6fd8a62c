"""Typed errors and the per-key Status shared by the SDK, the CLI and the servers.

Every failure a caller can act on has its own exception class deriving from `CellarError`;
per-key outcomes of batched calls are `Status` values mirroring `cellar.proto.Status`.
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """Per-key outcome of a batched call (same numbers as the proto enum)."""

    OK = 0
    NOT_FOUND = 1
    ALREADY_EXISTS = 2
    NO_SPACE = 3
    QUOTA_EXCEEDED = 4
    NOT_READY = 5
    INVALID = 6
    UNAVAILABLE = 7
    PERMISSION_DENIED = 8
    EXPIRED = 9
    INTERNAL = 10


class CellarError(Exception):
    """Base of every error the Cellar SDK raises."""

    status: Status = Status.INTERNAL


class NotFound(CellarError, KeyError):
    status = Status.NOT_FOUND

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "not found"


class AlreadyExists(CellarError):
    status = Status.ALREADY_EXISTS


class NoSpace(CellarError):
    status = Status.NO_SPACE


class QuotaExceeded(CellarError):
    status = Status.QUOTA_EXCEEDED


class NotReady(CellarError):
    status = Status.NOT_READY


class Unavailable(CellarError):
    status = Status.UNAVAILABLE


class Timeout(CellarError, TimeoutError):
    status = Status.UNAVAILABLE


class InvalidArgument(CellarError, ValueError):
    status = Status.INVALID


class PermissionDenied(CellarError):
    """The master knows the caller but refuses this (another tenant, a node RPC, not admin)."""

    status = Status.PERMISSION_DENIED


class Unauthenticated(PermissionDenied):
    """No credential, or one the master does not know (revoked, mistyped). A subclass of
    PermissionDenied, so `except cellar.PermissionDenied` catches both."""


class BufferTooSmall(InvalidArgument):
    """The destination buffer cannot hold the object; `needed_bytes` says how much it needs."""

    def __init__(self, message: str, needed_bytes: int = 0) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes


class IntegrityError(CellarError):
    """Every replica failed its checksum or could not be read intact."""

    status = Status.INTERNAL


class ConfigError(CellarError, ValueError):
    """A configuration value is invalid; `field` names the setting."""

    status = Status.INVALID

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


_BY_STATUS: dict[Status, type[CellarError]] = {
    Status.NOT_FOUND: NotFound,
    Status.ALREADY_EXISTS: AlreadyExists,
    Status.NO_SPACE: NoSpace,
    Status.QUOTA_EXCEEDED: QuotaExceeded,
    Status.NOT_READY: NotReady,
    Status.INVALID: InvalidArgument,
    Status.UNAVAILABLE: Unavailable,
    Status.PERMISSION_DENIED: PermissionDenied,
    Status.EXPIRED: Unavailable,
}


def error_for_status(status: int, message: str = "") -> CellarError:
    """The exception that a non-OK per-key status stands for."""
    st = Status(status)
    cls = _BY_STATUS.get(st, CellarError)
    return cls(message or st.name.lower().replace("_", " "))
