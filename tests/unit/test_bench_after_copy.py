"""The after-copy bench (bench/after_copy.py) drives the node's real write path for every size."""

from __future__ import annotations

from cellar.bench import after_copy

MiB = 1 << 20


def test_every_frame_size_is_admitted_received_and_sealed_by_the_node_code() -> None:
    # 12 frames over a 32 MiB segment: the 4 MiB frames wrap around its 8 slots, so the last
    # ones are admitted over older sealed objects (the index drops them), as on a busy node;
    # `run` asserts every frame's payload arrived whole and its write sealed with a receipt
    result = after_copy.run(12, segment_bytes=32 * MiB)
    assert sorted(result) == sorted(after_copy.SIZES)
    for row in result.values():
        assert row["admit_us"] > 0 and row["seal_us"] > 0 and row["copy_us"] > 0
    report = after_copy.markdown(result, 12)
    assert report.count("\n| ") == len(after_copy.SIZES) + 1  # the header row and one per size
    assert "| 4 MiB |" in report and "| 4 KiB |" in report
