"""The SDK calls behind `MooncakeDistributedStore`, with per-key Mooncake codes as results.

What it owns
    Every data call this room makes on a `cellar.Client`: batched puts (plain, upsert, from
    parts), batched gets into caller views (whole objects, and scattered over parts), whole
    reads, probes and removal. Each returns one Mooncake code (or byte count) per key, in input
    order, and never raises for a per-key failure.

Batches and per-key outcomes
    The SDK refuses a whole batch for a reason that may concern one key (a bad key, a buffer
    too small, parts that do not add up). Mooncake reports such failures per key, so after a
    refusal that is not about the whole call (the master unreachable, a deadline) the batch is
    redone key by key, and only the keys at fault fail.

What it must never do
    Let a cellar exception escape to the Mooncake caller, or report 0 for a key that failed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from cellar.client import Client, PutHints
from cellar.compat.mooncake.codes import ErrorCode, code_for, put_code
from cellar.errors import CellarError, Timeout, Unavailable

INVALID = int(ErrorCode.INVALID_PARAMS)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
# Raised errors that concern the whole call: retrying key by key would only wait again.
_WHOLE_CALL = (Unavailable, Timeout)


def _all(n: int, exc: BaseException, code_of: Callable[[BaseException], int] = code_for) -> list[int]:
    return [code_of(exc)] * n


def _put_each(items: Sequence[tuple[str, Any]], batch: Callable[[], list[Any]],
              one: Callable[[str, Any], None]) -> list[int]:
    """0 per stored (or, without upsert, already present) key: the whole batch in one call,
    and only when one item's problem (a bad key, a duplicate, an empty value) refuses the
    batch, item by item to find out which."""
    if not items:
        return []
    try:
        return [put_code(st) for st in batch()]
    except _WHOLE_CALL as exc:
        return _all(len(items), exc, put_code)
    except CellarError:
        pass
    out = []
    for key, value in items:
        try:
            one(key, value)
            out.append(0)
        except CellarError as exc:
            out.append(put_code(exc))
    return out


def put_views(client: Client, items: Sequence[tuple[str, Any]], *, replicas: int,
              soft_pin: bool, upsert: bool, hints: PutHints | None = None) -> list[int]:
    """Store each (key, buffer); 0 per stored (or, without upsert, already present) key."""
    write = client.upsert if upsert else client.put
    return _put_each(
        items,
        lambda: client.put_many(list(items), replicas=replicas, soft_pin=soft_pin, upsert=upsert,
                                hints=hints),
        lambda key, value: write(key, value, replicas=replicas, soft_pin=soft_pin, hints=hints))


def put_parts(client: Client, items: Sequence[tuple[str, Sequence[memoryview]]], *, replicas: int,
              soft_pin: bool, upsert: bool, hints: PutHints | None = None) -> list[int]:
    """Store each key as its parts concatenated in order (no staging copy)."""
    return _put_each(
        items,
        lambda: client.put_many_parts(list(items), replicas=replicas, soft_pin=soft_pin,
                                      upsert=upsert, hints=hints),
        lambda key, parts: client.put_parts(key, list(parts), replicas=replicas,
                                            soft_pin=soft_pin, upsert=upsert, hints=hints))


def get_views(client: Client, keys: Sequence[str], views: Sequence[memoryview]) -> list[int]:
    """Read each key into its view; bytes read, or a negative code per key."""
    if not keys:
        return []
    try:
        sizes = client.get_many_into(list(keys), list(views))
        return [n if n >= 0 else NOT_FOUND for n in sizes]
    except _WHOLE_CALL as exc:
        return _all(len(keys), exc)
    except CellarError:
        pass  # one key's problem (too small a buffer, a corrupt object): find out which
    out = []
    for key, view in zip(keys, views, strict=True):
        try:
            out.append(client.get_into(key, view))
        except CellarError as exc:
            out.append(code_for(exc))
    return out


def get_parts(client: Client, keys: Sequence[str], parts_per_key: Sequence[Sequence[memoryview]]) -> list[int]:
    """Read each key across its parts in order; bytes read, or a negative code per key.

    The SDK asks the parts to add up to the object exactly; Mooncake only asks them to hold it
    (the rest is left untouched). A key the batch refused is read again alone into the leading
    parts, cut to its size."""
    if not keys:
        return []
    try:
        sizes = client.get_many_into_parts(list(keys), [list(p) for p in parts_per_key])
        return [n if n >= 0 else NOT_FOUND for n in sizes]
    except _WHOLE_CALL as exc:
        return _all(len(keys), exc)
    except CellarError:
        pass
    return [_get_parts_one(client, key, parts) for key, parts in zip(keys, parts_per_key, strict=True)]


def _get_parts_one(client: Client, key: str, parts: Sequence[memoryview]) -> int:
    try:
        size = client.size(key)
        if size > sum(p.nbytes for p in parts):
            return INVALID  # the buffers cannot hold it (Mooncake: INVALID_PARAMS)
        return client.get_into_parts(key, _leading(parts, size))
    except CellarError as exc:
        return code_for(exc)


def _leading(parts: Sequence[memoryview], nbytes: int) -> list[memoryview]:
    """The first parts, the last one cut, holding exactly `nbytes`."""
    out = []
    for part in parts:
        if nbytes <= 0:
            break
        out.append(part[:nbytes])
        nbytes -= min(part.nbytes, nbytes)
    return out


def read_whole(client: Client, key: str) -> bytes | int:
    """The object's bytes, or its negative code."""
    try:
        return client.get(key)
    except CellarError as exc:
        return code_for(exc)


def remove_all(client: Client) -> int:
    """Remove every key of the client's tenant (the master's RemoveAll, through
    `Client.remove_all`); the count, or a negative code."""
    try:
        return client.remove_all()
    except CellarError as exc:
        return code_for(exc)


def remove_matching(client: Client, pattern: re.Pattern[str]) -> int:
    """Remove every key of the client's tenant in which `pattern` finds a match (re.search,
    as Mooncake's remove_by_regex), for patterns the master cannot serve as a prefix: the
    tenant's keys are listed a page at a time (ListKeys, `limits.max_list_keys` a page) and
    each page's matches removed in one batch before the next page is asked for, so memory stays
    one page whatever the tenant holds. Not atomic: a key put after its page was listed stays.
    The count removed, or a negative code (what was removed before the failure stays removed)."""
    page_keys = client.limits.max_list_keys
    removed = 0
    after = ""
    try:
        while True:
            page = client.list_keys(start_after=after, limit=page_keys)
            matches = [key for key in page if pattern.search(key)]
            if matches:
                removed += sum(client.remove_many(matches))
            if len(page) < page_keys:
                return removed
            after = page[-1]
    except CellarError as exc:
        return code_for(exc)


def exists_codes(client: Client, keys: Sequence[str]) -> list[int]:
    """1 present, 0 absent, or a negative code for every key when the probe failed."""
    if not keys:
        return []
    try:
        return [1 if hit else 0 for hit in client.exists_many(list(keys))]
    except CellarError as exc:
        return _all(len(keys), exc)
