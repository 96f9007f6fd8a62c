"""Helpers for the master's unit tests: a hand-driven clock and a MasterService with nodes.

Imported by the other tests/unit/test_master_*.py files (pytest puts this folder on sys.path);
it holds no tests itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from cellar.errors import Status
from cellar.master.config import MasterConfig
from cellar.master.service import MasterService, PutEndItem, PutItem
from cellar.proto import cellar_pb2 as pb
from tests.support.receipts import receipts_for

SECRET = bytes(range(32))
EPOCH = 1_700_000_000_000
KiB = 1024
MiB = 1024 * 1024


class FakeClock:
    """Monotonic seconds and wall milliseconds that only move when a test says so."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def monotonic(self) -> float:
        return self.now_s

    def wall_ms(self) -> int:
        return EPOCH + int(self.now_s * 1000)

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def make_service(
    clock: FakeClock | None = None, seed: int = 0, epoch: int = EPOCH, **settings: Any
) -> MasterService:
    settings.setdefault("new_node_ramp_s", 0.0)  # most tests do not want the newcomer ramp
    # Most tests fill their small segments with puts in flight; the WRITING cap has its own
    # tests (tests/security/test_limits_reservation.py) and the default hard-pin right too.
    settings.setdefault("max_tenant_writing_fraction", 1.0)
    settings.setdefault("tenants", {"default": {"hard_pin": True}})
    config = MasterConfig(**settings)
    config.validate()
    return MasterService(config, SECRET, clock=clock or FakeClock(), epoch=epoch, rng=random.Random(seed))


def segment_info(segment_id: int, size: int, host: str = "", node_id: str = "") -> pb.SegmentInfo:
    return pb.SegmentInfo(
        segment_id=segment_id, size_bytes=size, host_id=host or f"host-{segment_id}", node_id=node_id,
        endpoints=[pb.Endpoint(transport="tcp", address=f"127.0.0.1:{segment_id % 60000 + 1}")],
    )


def mount(
    svc: MasterService, node_id: str, segment_id: int, size: int = 64 * MiB, *, host: str = "",
    incarnation: int = 1,
) -> None:
    outcome = svc.mount_segment(node_id, incarnation, [segment_info(segment_id, size, host)])
    assert outcome.results == [(Status.OK, "")], outcome.results


def put_start(svc: MasterService, key: str, size: int, tenant: str = "", **kw: Any) -> Any:
    return svc.put_start(tenant, "writer", [PutItem(key, size, **kw)]).results[0]


def put(svc: MasterService, key: str, size: int, tenant: str = "", checksum: int = 7, **kw: Any) -> int:
    """PutStart + PutEnd; returns the put id (asserts both succeed)."""
    result = put_start(svc, key, size, tenant, **kw)
    assert result.status == Status.OK, (key, result.status, result.message)
    ends = svc.put_end(tenant, "writer", [PutEndItem(key, result.put_id, checksum, receipts_for(SECRET, result, checksum))])
    assert ends == [(Status.OK, "")], ends
    return int(result.put_id)


def get(svc: MasterService, key: str, tenant: str = "", client: str = "reader") -> Any:
    return svc.get_replicas(tenant, client, [key]).results[0]


def exists(svc: MasterService, key: str, tenant: str = "") -> int:
    return svc.exists(tenant, [key])[0]


@dataclass
class Entry:
    """One entry of a node's index report (ReportObjects), as the rebuild tests send it."""

    key: str
    alloc_id: int
    offset: int
    length: int
    checksum: int = 7
    tenant: str = "default"
    epoch: int = EPOCH - 60_000
    value_alloc_id: int = 0  # a copy's value: the alloc id of the put that wrote it
    soft_pin_until_ms: int = 0  # the soft pin the master noted to the node (0: none)
