"""The per-tier status rows (cellar.proto.tiers): the segment sum and the master's counters
merged into it, as the SDK's status(), /api/v1/status and /metrics all build them.

What a wrong merge would do differently: sum a tier's counters twice, lose a tier's counters
when the other has none, show a tier with no segment mounted, put the moves on DRAM, change
the caller's rows, or drop a tier's segment figures.
"""

from __future__ import annotations

from cellar.proto.tiers import (
    MOVE_COUNTERS,
    TIER_COUNTERS,
    TIER_DISK,
    TIER_DRAM,
    merge_tier_stats,
    moves_text,
    tier_totals,
)

MiB = 1 << 20


def _both() -> dict[str, dict[str, int]]:
    return tier_totals([(TIER_DRAM, 64 * MiB, 50 * MiB, 40), (TIER_DISK, 512 * MiB, 60 * MiB, 60),
                        (TIER_DRAM, 64 * MiB, 10 * MiB, 9)])


def test_each_tier_gets_its_own_counters_and_the_disk_row_the_moves() -> None:
    totals = _both()
    merged = merge_tier_stats(
        totals, [(TIER_DRAM, 12, 12 * MiB, 100 * MiB), (TIER_DISK, 7, 7 * MiB, 60 * MiB)],
        {"demotions": 36, "promotions": 1, "disk_evictions": 2, "spills": 3})
    assert merged == {
        "dram": {"capacity_bytes": 128 * MiB, "used_bytes": 60 * MiB, "objects": 49, "segments": 2,
                 "hits": 12, "read_bytes": 12 * MiB, "write_bytes": 100 * MiB},
        "disk": {"capacity_bytes": 512 * MiB, "used_bytes": 60 * MiB, "objects": 60, "segments": 1,
                 "hits": 7, "read_bytes": 7 * MiB, "write_bytes": 60 * MiB,
                 "demotions": 36, "promotions": 1, "disk_evictions": 2, "spills": 3},
    }
    assert totals == _both(), "the caller's rows were changed"


def test_a_row_sets_the_counters_it_never_adds_to_them() -> None:
    """The master's counters are already totals: merging the same reply's rows, or merging
    twice, must not double them."""
    stats = [(TIER_DRAM, 5, 5 * MiB, 9 * MiB), (TIER_DISK, 2, 2 * MiB, 3 * MiB)]
    once = merge_tier_stats(_both(), stats, {"demotions": 4})
    again = merge_tier_stats(once, stats, {"demotions": 4})
    assert again == once
    assert (once["dram"]["hits"], once["disk"]["hits"], once["disk"]["demotions"]) == (5, 2, 4)


def test_a_tier_without_a_row_shows_zeros_and_missing_moves_are_zero() -> None:
    merged = merge_tier_stats(_both(), [(TIER_DISK, 3, 3 * MiB, 4 * MiB)], {"spills": 1})
    assert {k: merged["dram"][k] for k in TIER_COUNTERS} == dict.fromkeys(TIER_COUNTERS, 0)
    assert {k: merged["disk"][k] for k in TIER_COUNTERS} == {
        "hits": 3, "read_bytes": 3 * MiB, "write_bytes": 4 * MiB}
    assert {k: merged["disk"][k] for k in MOVE_COUNTERS} == {
        "demotions": 0, "promotions": 0, "disk_evictions": 0, "spills": 1}


def test_only_the_mounted_tiers_are_shown_and_dram_never_carries_the_moves() -> None:
    """Without a disk segment (no disk tier, or its node gone) the disk's counters and the
    moves are left out, as /metrics leaves them out; DRAM's counters still show."""
    dram_only = tier_totals([(TIER_DRAM, 64 * MiB, 1 * MiB, 1)])
    merged = merge_tier_stats(dram_only, [(TIER_DRAM, 3, 3 * MiB, MiB), (TIER_DISK, 9, 9, 9)],
                              {"demotions": 5, "promotions": 5})
    assert set(merged) == {"dram"}
    assert merged["dram"] == {"capacity_bytes": 64 * MiB, "used_bytes": MiB, "objects": 1,
                              "segments": 1, "hits": 3, "read_bytes": 3 * MiB, "write_bytes": MiB}
    no_segments = merge_tier_stats(tier_totals([]), [(TIER_DRAM, 0, 0, 0)], {})
    assert no_segments == {"dram": {"capacity_bytes": 0, "used_bytes": 0, "objects": 0,
                                    "segments": 0, "hits": 0, "read_bytes": 0, "write_bytes": 0}}


def test_moves_text_names_every_move_in_order() -> None:
    disk = merge_tier_stats(_both(), [], {"demotions": 36, "promotions": 1, "disk_evictions": 0,
                                          "spills": 12})["disk"]
    assert moves_text(disk) == "disk moves: demotions 36, promotions 1, disk evictions 0, spills 12"
