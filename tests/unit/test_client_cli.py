"""The CLI's pure parts: table rendering and argument handling (no cluster)."""

from __future__ import annotations

import pytest

from cellar.client import cli
from cellar.devtools.ports import free_port


def test_format_table_aligns_columns():
    text = cli.format_table(["NAME", "COUNT"], [["a", 5], ["longer-name", 12345]])
    lines = text.splitlines()
    assert lines[0].startswith("NAME") and lines[0].endswith("COUNT")
    assert lines[1] == "a                5"
    assert lines[2] == "longer-name  12345"
    assert len({len(line) for line in lines}) == 1


def test_render_status_lists_nodes_and_tenants():
    status = {
        "role": "single", "epoch": 7, "capacity_bytes": 2 << 30, "used_bytes": 1 << 30,
        "object_count": 42, "max_object_bytes": 1 << 30,
        "nodes": [
            {"node_id": "node-0", "state": "ACTIVE", "segments": 1, "capacity_bytes": 1 << 30,
             "used_bytes": 1 << 29, "object_count": 20, "endpoints": {"tcp": "127.0.0.1:1"}},
            {"node_id": "node-1", "state": "SUSPECT", "segments": 1, "capacity_bytes": 1 << 30,
             "used_bytes": 1 << 29, "object_count": 22, "endpoints": {"tcp": "127.0.0.1:2", "shm": "/dev/shm/x"}},
        ],
        "tenants": [{"name": "default", "used_bytes": 1 << 30, "quota_bytes": 0,
                     "object_count": 42, "quota_objects": 0, "quarantined_bytes": 3 << 20}],
    }
    text = cli.render_status("127.0.0.1:50051", status)
    assert "HELD" in text and "3MiB" in text  # refused puts' ranges, on the tenant's quota
    assert "capacity 2GiB" in text and "used 1GiB (50.0%)" in text and "objects 42" in text
    assert "node-0" in text and "SUSPECT" in text and "127.0.0.1:2 +shm" in text
    assert "unlimited" in text and "default" in text
    empty = cli.render_status("x:1", {**status, "nodes": [], "tenants": [], "capacity_bytes": 0})
    assert "no storage nodes mounted" in empty and "used 1GiB (-)" in empty


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.put_main([])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        cli.get_main(["k", "--timeout", "soon"])
    assert info.value.code == 2


def test_unreachable_master_is_one_line(capsys, monkeypatch):
    port = free_port()  # nobody listens there
    monkeypatch.setenv("CELLAR_MASTER", f"127.0.0.1:{port}")
    assert cli.rm_main(["k", "--timeout", "200ms"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("cellar rm: Unavailable:") and "\n" not in err
