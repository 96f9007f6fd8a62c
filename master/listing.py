"""Key listing: one bounded page of a tenant's keys, in order (the ListKeys RPC).

What it owns
    The page rule and the checks of a ListKeys request. A page holds the keys of one tenant's
    table of visible objects (`Tenant.objects`: COMPLETE values, the same table `exists`
    answers from, so a put still in flight or a removed key is never listed) that start with
    `prefix` and sort strictly after `start_after`, in ascending Python `str` order (code
    point order, which is also the order of their UTF-8 bytes), at most `limit` of them, and
    whether more keys match (`more`). Walking every page with `start_after` = the last key
    of the page before lists each key that stays put exactly once.

The cost, and why it is acceptable
    The master keeps no sorted index: a page is one linear scan of the tenant's keys with
    `heapq.nsmallest(limit + 1, ...)`, O(n log limit) for a tenant of n objects, on the one
    event loop (RemovePrefix scans the same way). A listing of a whole tenant in pages of
    `limit` is O(n^2 / limit). Measured here (2-core VM, 1M keys of 48 characters, pages of
    1000): 20-90 ms per page, during which the master answers nothing else, so walking all
    1M keys holds the master's loop for about a minute in total (spread over 1000 calls).
    Listing is for tools and engine bookkeeping, not the request path; a sorted index would
    cost every put and remove a log-time insert to speed up this rare call.

What it must never do
    Change the table, list another tenant's keys, or return more than `limit` keys.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

from cellar.master.requests import RequestRejected, check_key_bound


def check_list_request(prefix: str, start_after: str, limit: int, *, max_list_keys: int,
                       max_key_bytes: int) -> None:
    """Refuse (RequestRejected: INVALID_ARGUMENT) a page size outside 1..max_list_keys or a
    prefix or start_after over max_key_bytes UTF-8 bytes."""
    if not 1 <= limit <= max_list_keys:
        raise RequestRejected(f"limit {limit} is outside 1..max_list_keys ({max_list_keys} keys)")
    check_key_bound("prefix", prefix, max_key_bytes)
    check_key_bound("start_after", start_after, max_key_bytes)


def key_page(keys: Iterable[str], prefix: str, start_after: str, limit: int) -> tuple[list[str], bool]:
    """The first `limit` keys of `keys` that start with `prefix` and sort after `start_after`,
    ascending, and whether more match (see the module docstring)."""
    assert limit >= 1, "a page holds at least one key (check_list_request)"
    matching = (k for k in keys if k > start_after and k.startswith(prefix))
    page = heapq.nsmallest(limit + 1, matching)
    more = len(page) > limit
    if more:
        page.pop()
    assert len(page) <= limit and all(a < b for a, b in pairwise(page)), "page out of order"
    return page, more


def list_page(service: Any, tenant_name: str, prefix: str, start_after: str,
              limit: int) -> tuple[list[str], bool]:
    """ListKeys on the master's tables: the request checked, the rebuild grace kept (keys not
    reported yet would be missing from the page), then `key_page` (its order, predicate and
    cost)."""
    tenant = service.tenant(tenant_name)
    config = service.config
    check_list_request(prefix, start_after, limit, max_list_keys=config.max_list_keys,
                       max_key_bytes=config.max_key_bytes)
    if service.recovering():
        raise service.grace.error()
    return key_page(tenant.objects, prefix, start_after, limit)
