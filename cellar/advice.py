"""Load or recompute: the one rule both the SDK's `lookup` and the master's HTTP lookup apply.

The source document's rule (reference §7): loading a cached prefix pays only when the prefill
time it saves exceeds what loading costs this client (lookup, the transfer it cannot hide,
layout conversion, extra synchronisation). Cellar measures the part it can see, the load time
of the leading run into this client (client/load_costs.py), and compares:

    tokens_reused   = prefix_len * tokens_per_key
    prefill_saved_s = tokens_reused / prefill_tokens_per_s
    advice          = "load"       if prefix_len > 0 and prefill_saved_s > load_s + overhead_s
                      "recompute"  otherwise

`overhead_s` is what the caller knows and Cellar does not (layout conversion, synchronisation);
0 by default. The rule is linear in tokens on purpose: a caller whose prefill cost grows faster
than linearly with context (attention) passes the rate that holds for its prompt length, since
half the tokens hit is not half the prefill saved. Pure arithmetic; no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cellar.errors import InvalidArgument

LOAD = "load"
RECOMPUTE = "recompute"
MAX_TOKENS_PER_KEY = 1 << 20          # tokens in one page key (pages hold 16..4096 tokens)
MAX_PREFILL_TOKENS_PER_S = 1e12       # beyond any engine; a bound on what a caller may say


@dataclass(frozen=True, slots=True)
class Advice:
    advice: str                 # LOAD | RECOMPUTE
    tokens_reused: int          # prefix_len * tokens_per_key
    prefill_saved_s: float      # tokens_reused / prefill_tokens_per_s
    load_s: float               # the estimate compared against (plus overhead_s)
    overhead_s: float = 0.0


def check_rate(prefill_tokens_per_s: float | None, tokens_per_key: int | None) -> None:
    """InvalidArgument unless both are given (or neither) and within bounds."""
    if prefill_tokens_per_s is None and tokens_per_key is None:
        return
    if tokens_per_key is None or isinstance(tokens_per_key, bool) or not isinstance(tokens_per_key, int) \
            or not 1 <= tokens_per_key <= MAX_TOKENS_PER_KEY:
        raise InvalidArgument(f"tokens_per_key must be an int in 1..{MAX_TOKENS_PER_KEY} "
                              "(tokens per page key) when a prefill rate is given")
    if tokens_per_key is not None and prefill_tokens_per_s is None:
        return  # tokens reused are reported; no advice without a rate
    rate = prefill_tokens_per_s
    # the range before math.isfinite, which raises OverflowError for an int past a float's range
    if isinstance(rate, bool) or not isinstance(rate, int | float) \
            or not 0 < rate <= MAX_PREFILL_TOKENS_PER_S or not math.isfinite(rate):
        raise InvalidArgument(f"prefill_tokens_per_s must be a number in (0, "
                              f"{MAX_PREFILL_TOKENS_PER_S:g}] (tokens per second)")


def advise(prefix_len: int, load_s: float, prefill_tokens_per_s: float, tokens_per_key: int,
           overhead_s: float = 0.0) -> Advice:
    """The rule of the module docstring (arguments checked by `check_rate` first)."""
    assert prefix_len >= 0 and load_s >= 0 and prefill_tokens_per_s > 0 and tokens_per_key > 0
    tokens = prefix_len * tokens_per_key
    saved_s = tokens / prefill_tokens_per_s
    load = prefix_len > 0 and saved_s > load_s + overhead_s
    return Advice(LOAD if load else RECOMPUTE, tokens, saved_s, load_s, overhead_s)
