"""Pure logic of the status page and the event log (no processes): escaping, bars, bounds."""

from __future__ import annotations

from cellar.client.top import bar
from cellar.client.top import render as render_top
from cellar.master.serving.events import MAX_MESSAGE_CHARS, EventLog
from cellar.master.serving.status_page import nodes_of, render, use_fraction


def _status(**over: object) -> dict[str, object]:
    status: dict[str, object] = {
        "role": "leader", "epoch": 7, "master_id": "m-0", "leader": {
            "master_id": "m-0", "address": "10.0.0.1:50051", "http": "10.0.0.1:9400", "epoch": 7},
        "takeover": {"epoch": 7, "complete": True, "duration_s": 0.5, "recovered_objects": 3, "nodes": 2},
        "capacity": 200, "used": 150, "objects": 3, "writing": 0, "pins": 1,
        "segments": [
            {"id": 1, "node": "n-b", "state": "SUSPECT", "capacity": 100, "used": 100, "objects": 2},
            {"id": 2, "node": "n-a", "state": "ACTIVE", "capacity": 50, "used": 25, "objects": 1},
            {"id": 3, "node": "n-a", "state": "ACTIVE", "capacity": 50, "used": 25, "objects": 0},
        ],
        "tenants": [{"name": "<b>evil</b>", "used_bytes": 50, "quota_bytes": 100, "objects": 1,
                     "quota_objects": 0, "quarantined_bytes": 40},
                    {"name": "default", "used_bytes": 100, "quota_bytes": 0, "objects": 2,
                     "quota_objects": 0}],
        "limits": {"eviction_high_watermark": 0.9},
    }
    status.update(over)
    return status


def test_nodes_are_grouped_from_segments() -> None:
    nodes = nodes_of(_status()["segments"])  # type: ignore[arg-type]
    assert [(n["node"], n["segments"], n["capacity"], n["used"], n["objects"]) for n in nodes] == [
        ("n-a", 2, 100, 50, 1), ("n-b", 1, 100, 100, 2)]


def test_page_escapes_everything_from_outside_and_has_no_script() -> None:
    log = EventLog()
    log.record("node_expired", "node <img src=x onerror=alert(1)> expired")
    page = render(_status(), log.recent())
    assert "<b>evil</b>" not in page and "&lt;b&gt;evil&lt;/b&gt;" in page
    assert "<img" not in page and "&lt;img" in page
    assert "<script" not in page and 'http-equiv="refresh"' in page
    assert "http://" not in page.split("</style>")[0]  # no external asset
    assert 'data-node="n-b" data-state="SUSPECT"' in page
    assert 'class="bar full"' in page  # n-b is 100% used
    assert "unlimited" in page  # default tenant has no byte quota
    # the held ranges of its refused puts count against its quota (master/quota.py): 50 + 40
    assert "<td>40B</td>" in page and "90.0%" in page


def test_use_fraction_is_clamped() -> None:
    assert use_fraction(5, 0) == 0.0
    assert use_fraction(150, 100) == 1.0
    assert use_fraction(25, 100) == 0.25


def test_event_log_is_bounded_newest_first_and_truncates() -> None:
    log = EventLog(max_events=3)
    for i in range(5):
        log.record("elected", f"event {i}")
    log.record("deposed", "x" * (MAX_MESSAGE_CHARS + 50))
    recent = log.recent()
    assert len(recent) == 3 and log.recorded_total == 6
    assert recent[0].kind == "deposed" and len(recent[0].message) == MAX_MESSAGE_CHARS
    assert [e.message for e in recent[1:]] == ["event 4", "event 3"]
    assert log.recent(1) == recent[:1]


def test_top_frame_shows_the_same_rows() -> None:
    status = _status()
    status["nodes"] = nodes_of(status["segments"])  # type: ignore[arg-type]
    frame = render_top("10.0.0.1:9400", status, [{"time": 0, "kind": "node_expired", "message": "n-c gone"}])
    assert "role leader" in frame and "epoch 7" in frame
    for text in ("n-a", "n-b", "SUSPECT", "<b>evil</b>", "node_expired", "n-c gone"):
        assert text in frame
    assert bar(90, 100) in frame  # used + held against the quota
    assert bar(50, 100, width=10) == "[#####.....]  50.0%"
    assert bar(1, 0) == "-"
