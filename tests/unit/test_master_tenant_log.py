"""The tenant log (master/serving/tenant_log.py), without processes: what the admin API sets
is written before it takes effect, read back by the next master, and bounds-checked on load.
The same across a real kill -9 and a failover: tests/faults/test_master_restart.py and
test_ha_failover.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_master_support import SECRET

from cellar.errors import QuotaExceeded
from cellar.master.config import MasterConfig
from cellar.master.serving.leadership import Leadership
from cellar.master.serving.tenant_log import FileTenantLog, fields_of
from cellar.master.state.records import TenantQuota


def leadership_with(path: Path, **settings) -> Leadership:
    leadership = Leadership(MasterConfig(new_node_ramp_s=0.0, **settings), SECRET, ha=False)
    leadership.attach_tenant_log(FileTenantLog(path))
    return leadership


def test_a_tenant_set_through_the_api_is_known_to_the_next_master(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    first = leadership_with(path, tenants={"acme": {"quota_bytes": "1GiB"}})
    asyncio.run(first.set_tenant("acme", TenantQuota(quota_bytes=4096, quota_objects=7)))
    asyncio.run(first.set_tenant("new", TenantQuota(default_bytes=True, hard_pin=True)))
    assert first.tenant_log is not None and first.tenant_log.writes == 2

    # the next master: the API's word wins over the config file's for acme
    second = leadership_with(path, tenants={"acme": {"quota_bytes": "1GiB"}})
    acme = second.service.tenants.by_name["acme"]
    assert (acme.quota_bytes, acme.quota_objects) == (4096, 7)
    new = second.service.tenants.by_name["new"]
    assert new.default_quota and new.may_hard_pin


def test_records_off_disk_are_checked_and_bad_ones_skipped(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({
        "ok": fields_of(TenantQuota(quota_bytes=1 << 20)),
        "bad name!": {},                         # not a tenant name
        "huge": {"quota_bytes": 1 << 80},        # over MAX_QUOTA
        "neg": {"quota_objects": -1},
        "odd": {"quota_bytes": 1, "shell": "rm -rf /"},  # an unknown field
        "flag": {"hard_pin": "yes"},             # not a boolean
    }))
    leadership = leadership_with(path)
    names = set(leadership.service.tenants.by_name)
    assert "ok" in names
    assert not names & {"bad name!", "huge", "neg", "odd", "flag"}


def test_a_log_that_is_not_json_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    path.write_text("{not json")
    with pytest.raises(OSError, match="not JSON"):
        leadership_with(path)


class _BrokenLog(FileTenantLog):
    async def write(self, name: str, quota: TenantQuota) -> None:
        raise OSError("disk full")


def test_a_refused_write_changes_nothing(tmp_path: Path) -> None:
    leadership = Leadership(MasterConfig(new_node_ramp_s=0.0, max_tenants=2), SECRET, ha=False)
    leadership.attach_tenant_log(_BrokenLog(tmp_path / "tenants.json"))
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(leadership.set_tenant("acme", TenantQuota(quota_bytes=1)))
    assert "acme" not in leadership.service.tenants.by_name
    with pytest.raises(OSError):  # an existing tenant's quotas stay as they were
        asyncio.run(leadership.set_tenant("default", TenantQuota(quota_bytes=1)))
    assert leadership.service.tenants.by_name["default"].quota_bytes == 0

    # past max_tenants nothing is written at all (default + one more)
    ok = leadership_with(tmp_path / "other.json", max_tenants=2)
    asyncio.run(ok.set_tenant("one", TenantQuota()))
    with pytest.raises(QuotaExceeded):
        asyncio.run(ok.set_tenant("two", TenantQuota()))
    assert set(json.loads((tmp_path / "other.json").read_text())) == {"one"}


def test_concurrent_writes_keep_every_tenant(tmp_path: Path) -> None:
    """Two PUTs in flight at once (each awaits its file write): both tenants are in the file
    afterwards, not only the one whose rename came last."""
    path = tmp_path / "tenants.json"
    leadership = leadership_with(path)

    async def both() -> None:
        await asyncio.gather(*(leadership.set_tenant(f"t{i}", TenantQuota(quota_objects=i + 1))
                               for i in range(8)))

    asyncio.run(both())
    assert set(json.loads(path.read_text())) == {f"t{i}" for i in range(8)}
    again = leadership_with(path)
    assert {f"t{i}" for i in range(8)} <= set(again.service.tenants.by_name)
