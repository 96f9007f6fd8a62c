"""SGLang's `timeout` prefetch budget, sized from Cellar's load estimate.

How SGLang computes it (0.5.23, `unified_radix_cache._start_storage_prefetch_wait` and
`storage_attachment.apply_runtime_config`): under `--hicache-storage-prefetch-policy timeout` a
prefetch of P pages may run for

    prefetch_timeout_base + P * (page_size / 1024) * prefetch_timeout_per_ki_token   seconds,

after which the scheduler stops waiting and takes what landed. Both numbers are keys of
`--hicache-storage-backend-extra-config` (defaults 1 s and 0.25 s per 1024 tokens), read by
SGLang's `HybridCacheController.parse_storage_backend_extra_config` and popped before the
backend is created, at launch and when a backend is attached at run time. No call lets a
storage backend set the budget: the backend sees neither the scheduler nor the numbers'
destination. So Cellar offers the numbers, not a hook: `timeout_config` turns this client's
load estimate (`Client.load_estimate`: measured round trip and read throughput) into the two
keys, for the operator to put in the extra config at the next launch or attach. What SGLang
would need to take the estimate live: a backend method such as
`prefetch_timeout_s(page_count) -> float | None` that `_start_storage_prefetch_wait` asks before
falling back to base + P * per_page.

The rule: the budget covers `margin` times the estimated load of any page count, and never goes
below `min_base_s` (scheduler polls and the backend's own round trips need a floor):

    base_s       = max(min_base_s, margin * rtt_s)
    per_ki_token = margin * (page_bytes / bytes_per_s) * 1024 / page_size_tokens

Pure arithmetic on the estimate; it imports nothing of SGLang and does no I/O.
"""

from __future__ import annotations

import math
from typing import Any

from cellar.errors import InvalidArgument

DEFAULT_MARGIN = 2.0          # budget / estimated load (the estimate is good to within 2x)
MAX_MARGIN = 100.0
DEFAULT_MIN_BASE_S = 0.05     # seconds: a few scheduler steps, whatever the estimate says
MAX_BASE_S = 3600.0           # seconds: a budget beyond an hour is a misconfiguration


def timeout_config(estimate: Any, page_bytes: int, page_size_tokens: int, *,
                   margin: float = DEFAULT_MARGIN,
                   min_base_s: float = DEFAULT_MIN_BASE_S) -> dict[str, float]:
    """SGLang's `prefetch_timeout_base` (s) and `prefetch_timeout_per_ki_token` (s per 1024
    tokens) for pages of `page_bytes` bytes (every object of a page) and `page_size_tokens`
    tokens, from `estimate` (a `LoadEstimate`: rtt_s, bytes_per_s)."""
    if isinstance(page_bytes, bool) or not isinstance(page_bytes, int) or page_bytes <= 0:
        raise InvalidArgument(f"page_bytes must be an int > 0, got {page_bytes!r}")
    if isinstance(page_size_tokens, bool) or not isinstance(page_size_tokens, int) \
            or page_size_tokens <= 0:
        raise InvalidArgument(f"page_size_tokens must be an int > 0, got {page_size_tokens!r}")
    if not 1.0 <= margin <= MAX_MARGIN:
        raise InvalidArgument(f"margin must be in [1, {MAX_MARGIN:g}], got {margin!r}")
    if not 0.0 <= min_base_s <= MAX_BASE_S:
        raise InvalidArgument(f"min_base_s must be in [0, {MAX_BASE_S:g}] s, got {min_base_s!r}")
    rtt_s, rate = float(estimate.rtt_s), float(estimate.bytes_per_s)
    assert math.isfinite(rtt_s) and rtt_s >= 0 and math.isfinite(rate) and rate > 0, estimate
    base_s = min(MAX_BASE_S, max(min_base_s, margin * rtt_s))
    per_ki_token_s = margin * (page_bytes / rate) * 1024 / page_size_tokens
    return {"prefetch_timeout_base": base_s, "prefetch_timeout_per_ki_token": per_ki_token_s}


def budget_s(config: dict[str, float], page_count: int, page_size_tokens: int) -> float:
    """The wait SGLang grants a prefetch of `page_count` pages under `config` (its formula,
    above), for checking a configuration against the estimate."""
    return config["prefetch_timeout_base"] + page_count * (
        page_size_tokens / 1024 * config["prefetch_timeout_per_ki_token"])
