"""The SGLang adapter's line to Cellar: one SDK client, connected lazily, never raising.

Why it exists
    HiCache calls its storage backend from the controller's prefetch and backup threads; an
    exception there is logged and the operation dropped, and one during `attach` disables L3
    for the whole instance. A cache that is down must look like a cache that is empty. So every
    call goes through `Link.call(what, fn, fallback)`: it (re)connects when it has no client
    (at most once per `RECONNECT_INTERVAL_S`), runs `fn(client)`, and turns any failure into
    `fallback` plus one rate-limited warning. The engine sees misses, a shorter prefix or a
    failed backup, and gets its pages back when the cluster answers again.

    The SDK's capabilities are read once per client (`Capabilities`): the scatter-gather and
    deadline-bounded forms (`put_many_parts`, `get_many_into_parts`, `get_many_into(...,
    timeout_s=, prefix=)`) are used where the SDK has them; otherwise the adapter falls back
    to a copy through a staging buffer (multi-part objects) and page chunks checked against
    the deadline between chunks (`sglang.py`).

What it must never do
    Let an exception from Cellar reach SGLang, or keep a client that could not connect.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import cellar

log = logging.getLogger("cellar.integrations.sglang")

T = TypeVar("T")

RECONNECT_INTERVAL_S = 1.0
# One warning per kind of failure per interval: a dead cluster must not flood the engine's log.
WARN_INTERVAL_S = 10.0


@dataclass(frozen=True)
class Capabilities:
    parts: bool  # put_many_parts / get_many_into_parts
    deadline: bool  # get_many_into(..., timeout_s=, prefix=)

    @classmethod
    def of(cls, client: Any) -> Capabilities:
        try:
            params = inspect.signature(client.get_many_into).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        return cls(parts=hasattr(client, "get_many_into_parts") and hasattr(client, "put_many_parts"),
                   deadline="timeout_s" in params and "prefix" in params)


class Link:
    """A lazily (re)connected `cellar.Client`, shared by the backend's threads (the sync
    client is thread-safe)."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._on_connect: list[Callable[[Any], None]] = []
        self._lock = threading.Lock()
        self._client: Any = None
        self._caps = Capabilities(parts=False, deadline=False)
        self._next_attempt = 0.0
        self._warned: dict[str, float] = {}
        self._closed = False

    def _get(self) -> tuple[Any, Capabilities] | None:
        with self._lock:
            if self._closed:
                return None
            if self._client is None and time.monotonic() >= self._next_attempt:
                self._next_attempt = time.monotonic() + RECONNECT_INTERVAL_S
                try:
                    client = self._connect()
                    for hook in self._on_connect:
                        hook(client)
                    self._client, self._caps = client, Capabilities.of(client)
                except Exception as e:  # noqa: BLE001 - any failure to connect is an outage
                    self.warn("connect", f"cannot reach Cellar: {e}")
                    self._client = None
            return None if self._client is None else (self._client, self._caps)

    def on_connect(self, hook: Callable[[Any], None]) -> None:
        """Run `hook(client)` on the current client and on every new one (e.g. to register
        memory with it); a hook that raises makes that connection attempt fail."""
        with self._lock:
            self._on_connect.append(hook)
            client = self._client
        if client is not None:
            try:
                hook(client)
            except Exception as e:  # noqa: BLE001
                self.warn("connect", f"setting up the Cellar client failed: {e}")

    def call(self, what: str, fn: Callable[[Any, Capabilities], T], fallback: T) -> T:
        got = self._get()
        if got is None:
            return fallback
        try:
            return fn(*got)
        except Exception as e:  # noqa: BLE001 - the engine must never see Cellar's exceptions
            self.warn(what, f"{what} failed: {type(e).__name__}: {e}")
            return fallback

    def warn(self, kind: str, message: str) -> None:
        now = time.monotonic()
        if now >= self._warned.get(kind, 0.0):
            self._warned[kind] = now + WARN_INTERVAL_S
            log.warning("Cellar HiCache backend: %s", message)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception as e:  # noqa: BLE001
                log.debug("closing the Cellar client: %s", e)


def connect_from(settings: dict[str, Any]) -> Callable[[], Any]:
    """The connect function for the backend's settings (see `sglang.Settings`)."""

    def connect() -> Any:
        return cellar.connect(settings["master"], tenant=settings["tenant"],
                              token=settings["token"], timeout_s=settings["timeout_s"],
                              transport=settings["transport"])

    return connect
