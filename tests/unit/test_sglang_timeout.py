"""integrations/sglang/timeout.py: SGLang's timeout prefetch budget from a load estimate covers
`margin` times the estimated load of any page count, keeps its floor, and refuses bad input."""

from __future__ import annotations

import pytest

import cellar
from cellar.client.load_costs import LoadCosts, LoadEstimate
from cellar.integrations.sglang.timeout import DEFAULT_MIN_BASE_S, budget_s, timeout_config

PAGE_BYTES, PAGE_TOKENS = 1 << 20, 64


def test_budget_covers_the_margin_times_the_estimate_for_any_page_count() -> None:
    costs = LoadCosts()
    for _ in range(8):
        costs.rpc("GetReplicas", 0.2)   # a slow metadata line: the base follows it
        costs.read("tcp", 64 << 20, 0.5)  # 128 MiB/s
    for margin in (1.0, 2.0, 3.5):
        config = timeout_config(costs.estimate(PAGE_BYTES), PAGE_BYTES, PAGE_TOKENS,
                                margin=margin)
        for pages in (1, 7, 64, 4096):
            load_s = costs.estimate(pages * PAGE_BYTES).load_s
            assert budget_s(config, pages, PAGE_TOKENS) >= margin * load_s * (1 - 1e-12)
            assert budget_s(config, pages, PAGE_TOKENS) <= margin * load_s + DEFAULT_MIN_BASE_S


def test_faster_clients_get_shorter_budgets_and_the_floor_holds() -> None:
    slow = LoadEstimate(0.0, 1e-4, 1e8, "tcp", "measured")
    fast = LoadEstimate(0.0, 1e-4, 1e10, "shm", "measured")
    slow_cfg = timeout_config(slow, PAGE_BYTES, PAGE_TOKENS)
    fast_cfg = timeout_config(fast, PAGE_BYTES, PAGE_TOKENS)
    assert fast_cfg["prefetch_timeout_per_ki_token"] * 100 == pytest.approx(
        slow_cfg["prefetch_timeout_per_ki_token"])
    assert fast_cfg["prefetch_timeout_base"] == DEFAULT_MIN_BASE_S  # 2 x 0.1 ms is below it


@pytest.mark.parametrize("kwargs", [
    {"page_bytes": 0}, {"page_bytes": True}, {"page_size_tokens": 0}, {"margin": 0.5},
    {"margin": 1e9}, {"min_base_s": -1.0}])
def test_refusals(kwargs: dict) -> None:
    args = {"page_bytes": PAGE_BYTES, "page_size_tokens": PAGE_TOKENS, **kwargs}
    estimate = LoadEstimate(0.0, 1e-4, 1e9, "tcp", "measured")
    with pytest.raises(cellar.InvalidArgument):
        timeout_config(estimate, args.pop("page_bytes"), args.pop("page_size_tokens"), **args)
