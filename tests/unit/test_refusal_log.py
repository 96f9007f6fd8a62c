"""cellar/refusals.py: at most one line per peer per interval, with a count (issue #19, 6)."""

from __future__ import annotations

import logging

import pytest

from cellar.refusals import OTHER_PEERS, RefusalLog


def test_one_line_per_peer_per_interval_then_a_count(caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("cellar.refusals.time.monotonic", lambda: now[0])
    log = RefusalLog(logging.getLogger("test.refusals"), "master", interval_s=10)
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for _ in range(1000):
            log.note("10.0.0.1", "bad_token", "malformed credential")
        log.note("10.0.0.2", "bad_token", "x\nforged line")
        now[0] += 10
        log.note("10.0.0.1", "bad_token", "malformed credential")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and log.lines == 3
    assert "10.0.0.1" in lines[0] and "(1 refusal " in lines[0]
    assert "\\n" in lines[1] and "\n" not in lines[1]  # a network string cannot forge a line
    assert "(1000 refusals " in lines[2]  # the 999 held back, and this one


def test_the_peer_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cellar.refusals.time.monotonic", lambda: 5.0)
    log = RefusalLog(logging.getLogger("test.refusals"), "node", interval_s=10, max_peers=4)
    for i in range(100):
        log.note(f"10.0.0.{i}", "auth_timeout")
    assert len(log._peers) == 4 and OTHER_PEERS in log._peers
    assert log.lines == 4  # three peers and the shared entry, one line each
    log.note("10.0.0.1", "auth_timeout")  # a known peer keeps its own entry
    assert log._peers["10.0.0.1"][0] == 1


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RefusalLog(logging.getLogger("x"), "x", interval_s=0)
