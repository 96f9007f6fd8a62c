"""What a mount tells the master: the segments' descriptions and the index report in batches.

Owns the shape of the rebuild report (master_link.py's docstring tells the protocol): SEALED
index entries grouped per segment, every mounted segment reported even when empty (its `last`
batch is what lets the master place in it again), each batch at most REPORT_BATCH_ENTRIES
entries and about REPORT_BATCH_BYTES (well under the master's 4 MiB message limit).
Must never: do I/O, touch segment memory, or change the index (the link applies refusals).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cellar.proto import cellar_pb2 as pb
from cellar.storage_node.segment import Segment

REPORT_BATCH_ENTRIES = 2000
REPORT_BATCH_BYTES = 2 << 20
ENTRY_OVERHEAD_BYTES = 64       # a reported entry's fields besides its strings
BYTES_PER_CHAR = 4              # UTF-8's worst case, so a batch never exceeds its bound


def segment_infos(segments: Sequence[Segment], node_id: str, host_id: str, tcp_address: str,
                  extra_endpoints: Mapping[int, list[pb.Endpoint]]) -> list[pb.SegmentInfo]:
    return [
        pb.SegmentInfo(
            segment_id=s.segment_id, node_id=node_id, size_bytes=s.size_bytes, host_id=host_id,
            endpoints=[
                pb.Endpoint(transport="tcp", address=tcp_address),
                # a disk-tier file too: a same-host client with the shm right maps it and reads
                # warm pages at copy speed, not loopback TCP's (docs/disk-tier.md#reads)
                pb.Endpoint(transport="shm", address=str(s.path) if s.path else ""),
                *extra_endpoints.get(s.segment_id, []),
            ],
            tier=s.tier,
        )
        for s in segments
    ]


def report_batches(entries: Sequence[Any], segment_ids: Sequence[int],
                   ) -> Iterator[tuple[int, list[pb.ReportedObject], bool]]:
    """(segment id, batch, last) in sending order: every segment in `segment_ids` (then any
    other an entry names), each ending with one `last` batch (possibly empty)."""
    by_segment: dict[int, list[Any]] = {segment_id: [] for segment_id in segment_ids}
    for entry in entries:
        by_segment.setdefault(entry.segment_id, []).append(entry)
    for segment_id, items in by_segment.items():
        start = 0
        while True:
            batch: list[pb.ReportedObject] = []
            size = 0
            while (start < len(items) and len(batch) < REPORT_BATCH_ENTRIES
                   and size < REPORT_BATCH_BYTES):
                e = items[start]
                start += 1
                size += (ENTRY_OVERHEAD_BYTES + (len(e.key) + len(e.tenant)) * BYTES_PER_CHAR
                         + len(e.engine_hash))
                batch.append(pb.ReportedObject(
                    tenant=e.tenant, key=e.key, alloc_id=e.alloc_id, offset=e.offset,
                    length=e.length, checksum=e.checksum, epoch=e.epoch,
                    engine_hash=e.engine_hash, value_alloc_id=e.value_id,
                    soft_pin_until_ms=e.soft_pin_until_ms))
            last = start >= len(items)
            assert len(batch) <= REPORT_BATCH_ENTRIES
            yield segment_id, batch, last
            if last:
                break
