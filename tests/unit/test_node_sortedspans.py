"""SortedSpans (storage_node/sortedspans.py) against a plain sorted list, through bucket splits
and empties."""

from __future__ import annotations

import random
from bisect import bisect_left, insort

import pytest

from cellar.storage_node import sortedspans
from cellar.storage_node.sortedspans import SortedSpans


@pytest.mark.parametrize("seed", range(5))
def test_matches_a_sorted_list(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(sortedspans, "BUCKET_ITEMS", 4)  # many buckets, many splits
    rng = random.Random(seed)
    spans = SortedSpans()
    model: list[tuple[int, int]] = []
    for step in range(3000):
        if model and rng.random() < 0.4:
            item = rng.choice(model) if rng.random() < 0.9 else (rng.randrange(500), -5)
            assert spans.remove(item) == (item in model)
            if item in model:
                model.remove(item)
        else:
            item = (rng.randrange(500), step)
            spans.add(item)
            insort(model, item)
        probe = (rng.randrange(-5, 505), -1)
        i = bisect_left(model, probe)
        assert spans.before(probe) == (model[i - 1] if i > 0 else None)
        assert spans.neighbours(probe) == (model[i - 1] if i > 0 else None,
                                           model[i] if i < len(model) else None)
        assert list(spans.from_(probe)) == model[i:]
        assert len(spans) == len(model) and list(spans) == model


def test_empty_and_appending() -> None:
    spans = SortedSpans()
    assert not spans and spans.before((0, -1)) is None and spans.neighbours((0, -1)) == (None, None)
    assert list(spans.from_((0, -1))) == [] and not spans.remove((1, 1))
    for off in range(0, 10_000, 10):  # a segment filled front to back: appends only
        spans.add((off, off))
    assert len(spans) == 1000 and spans.before((55, -1)) == (50, 50)
    assert list(spans.from_((9_975, -1))) == [(9_980, 9_980), (9_990, 9_990)]
