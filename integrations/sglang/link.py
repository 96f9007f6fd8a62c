"""The SGLang adapter's line to Cellar: one SDK client, connected lazily, never raising.

Why it exists
    HiCache calls its storage backend from the controller's prefetch and backup threads; an
    exception there is logged and the operation dropped, and one during `attach` disables L3
    for the whole instance. A cache that is down must look like a cache that is empty. So every
    call goes through `Link.call(what, fn, fallback)`: it (re)connects when it has no client
    (at most once per `RECONNECT_INTERVAL_S`), runs `fn(client)`, and turns any failure into
    `fallback` plus one rate-limited warning. The engine sees misses, a shorter prefix or a
    failed backup, and gets its pages back when the cluster answers again.

What it must never do
    Let an exception from Cellar reach SGLang, or keep a client that could not connect.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import cellar

log = logging.getLogger("cellar.integrations.sglang")

T = TypeVar("T")

RECONNECT_INTERVAL_S = 1.0
# One warning per kind of failure per interval: a dead cluster must not flood the engine's log.
WARN_INTERVAL_S = 10.0


class Link:
    """A lazily (re)connected `cellar.Client`, shared by the backend's threads (the sync
    client is thread-safe)."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._on_connect: list[Callable[[Any], None]] = []
        self._lock = threading.Lock()
        self._client: Any = None
        self._next_attempt = 0.0
        self._warned: dict[str, float] = {}
        self._closed = False

    def _get(self) -> Any | None:
        with self._lock:
            if self._closed:
                return None
            if self._client is None and time.monotonic() >= self._next_attempt:
                self._next_attempt = time.monotonic() + RECONNECT_INTERVAL_S
                try:
                    client = self._connect()
                    for hook in self._on_connect:
                        hook(client)
                    self._client = client
                except Exception as e:  # noqa: BLE001 - any failure to connect is an outage
                    self.warn("connect", f"cannot reach Cellar: {e}")
                    self._client = None
            return self._client

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

    def call(self, what: str, fn: Callable[[Any], T], fallback: T) -> T:
        client = self._get()
        if client is None:
            return fallback
        try:
            return fn(client)
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
