"""The SGLang adapter's line to Cellar (cellar.integrations.sglang.link): pure logic with a stand-in
connect function; the real cluster and engine are in tests/engines/."""

from __future__ import annotations

from typing import Any

import pytest

import cellar
from cellar.integrations.sglang import link as sglang_link
from cellar.integrations.sglang.link import Link


class Client:
    closed = False

    def close(self) -> None:
        self.closed = True


def test_failures_become_the_fallback_and_reconnect_is_rate_limited(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(sglang_link.time, "monotonic", lambda: now[0])
    attempts: list[int] = []
    up = [False]

    def connect() -> Client:
        attempts.append(1)
        if not up[0]:
            raise cellar.Unavailable("master down")
        return Client()

    link = Link(connect)
    assert link.call("x", lambda c: 1, 0) == 0
    assert link.call("x", lambda c: 1, 0) == 0
    assert len(attempts) == 1  # no second attempt within RECONNECT_INTERVAL_S
    up[0] = True
    now[0] += sglang_link.RECONNECT_INTERVAL_S
    assert link.call("x", lambda c: 1, 0) == 1

    def boom(c: Any) -> int:
        raise cellar.Timeout("slow")

    assert link.call("x", boom, -5) == -5  # an error in a call is its fallback, never raised
    assert isinstance(link.call("x", lambda c: c, None), Client)  # the connected client
    link.close()
    assert link.call("x", lambda c: 1, 0) == 0  # closed: never reconnects


def test_hooks_run_on_every_new_client() -> None:
    seen: list[Any] = []
    link = Link(Client)
    link.on_connect(seen.append)
    link.call("x", lambda c: None, None)
    assert len(seen) == 1 and isinstance(seen[0], Client)

