"""The SDK calls behind `MooncakeDistributedStore`, with per-key Mooncake codes as results.

What it owns
    Every call this room makes on a `cellar.Client`: batched puts (plain, upsert, from parts),
    batched gets into caller views (whole objects and scatter into parts), ranged reads, and
    removal. Each returns one Mooncake code (or byte count) per key, in input order, and never
    raises for a per-key failure: a raised SDK error becomes that code for every key it hit.

The switch to the new SDK faces (issue 11)
    The SDK grows `put_many(..., upsert=True)`, `put_many_parts` and `get_many_into_parts`
    (and, once asked for, `remove_all`). Where the connected client has them they are used; until then the fallbacks
    below do the same with today's calls: upserts one by one, parts joined into one buffer
    (a copy) on put and received into a scratch buffer then scattered (a copy) on get. Each
    fallback is marked `# until sdk-faces`, so the switch is deleting those branches.

What it must never do
    Let a cellar exception escape to the Mooncake caller, or report 0 for a key that failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cellar.client import Client
from cellar.compat.mooncake_codes import ErrorCode, code_for, put_code
from cellar.errors import CellarError, Status, Timeout, Unavailable

View = memoryview
# Raised errors that concern the whole call (the master is unreachable): retrying key by key
# would only wait again. Anything else may concern one key, so the batch is redone per key.
_WHOLE_CALL = (Unavailable, Timeout)


def _all(n: int, exc: BaseException, code_of: Callable[[BaseException], int] = code_for) -> list[int]:
    return [code_of(exc)] * n


def put_views(client: Client, items: Sequence[tuple[str, Any]], *, replicas: int,
              soft_pin: bool, upsert: bool) -> list[int]:
    """Store each (key, buffer); 0 per stored (or, without upsert, already present) key."""
    if not items:
        return []
    batched = not upsert or _accepts(client.put_many, "upsert")  # until sdk-faces: else one by one
    if batched:
        options = {"upsert": True} if upsert else {}
        try:
            statuses = client.put_many(list(items), replicas=replicas, soft_pin=soft_pin, **options)
            return [put_code(st) for st in statuses]
        except _WHOLE_CALL as exc:
            return _all(len(items), exc, put_code)
        except CellarError:
            pass  # one item's problem (a bad key, a duplicate): find out which
    write = client.upsert if upsert else client.put
    out = []
    for key, value in items:
        try:
            write(key, value, replicas=replicas, soft_pin=soft_pin)
            out.append(0)
        except CellarError as exc:
            out.append(put_code(exc))
    return out


def put_parts(client: Client, items: Sequence[tuple[str, Sequence[View]]], *, replicas: int,
              soft_pin: bool, upsert: bool) -> list[int]:
    """Store each key as its parts concatenated in order."""
    many_parts = getattr(client, "put_many_parts", None)
    if many_parts is not None:
        try:
            statuses = many_parts(list(items), replicas=replicas, soft_pin=soft_pin, upsert=upsert)
        except CellarError as exc:
            return _all(len(items), exc, put_code)
        return [put_code(st) for st in statuses]
    joined = [(key, b"".join(parts)) for key, parts in items]  # until sdk-faces: one copy
    return put_views(client, joined, replicas=replicas, soft_pin=soft_pin, upsert=upsert)


def get_views(client: Client, keys: Sequence[str], views: Sequence[View]) -> list[int]:
    """Read each key into its view; bytes read, or a negative code per key."""
    if not keys:
        return []
    try:
        sizes = client.get_many_into(list(keys), list(views))
        return [n if n >= 0 else int(ErrorCode.OBJECT_NOT_FOUND) for n in sizes]
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


def get_parts(client: Client, keys: Sequence[str], parts_per_key: Sequence[Sequence[View]]) -> list[int]:
    """Read each key across its parts in order (the object must fit in their total)."""
    many_parts = getattr(client, "get_many_into_parts", None)
    if many_parts is not None:
        try:
            sizes = many_parts(list(keys), [list(p) for p in parts_per_key])
        except CellarError as exc:
            return _all(len(keys), exc)
        return [n if n >= 0 else code_for(Status.NOT_FOUND) for n in sizes]
    # until sdk-faces: receive into one scratch buffer per key, then scatter (a copy)
    scratch = [bytearray(sum(p.nbytes for p in parts)) for parts in parts_per_key]
    results = get_views(client, keys, [memoryview(b) for b in scratch])
    for n, buf, parts in zip(results, scratch, parts_per_key, strict=True):
        offset = 0
        for part in parts:
            if offset >= n:
                break
            take = min(part.nbytes, n - offset)
            part[:take] = buf[offset:offset + take]
            offset += take
    return results


def read_whole(client: Client, key: str) -> bytes | int:
    """The object's bytes, or its negative code."""
    try:
        return client.get(key)
    except CellarError as exc:
        return code_for(exc)


def remove_all(client: Client) -> int:
    """Remove every key of the client's tenant; the count, or a negative code. The master has
    the RemoveAll RPC but the SDK does not wrap it yet: until `Client.remove_all` exists this
    returns NOT_SUPPORTED (this room talks to the cluster only through the SDK)."""
    sdk_remove_all = getattr(client, "remove_all", None)
    if sdk_remove_all is None:
        return int(ErrorCode.NOT_SUPPORTED)
    try:
        return int(sdk_remove_all())
    except CellarError as exc:
        return code_for(exc)


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def exists_codes(client: Client, keys: Sequence[str]) -> list[int]:
    """1 present, 0 absent, or a negative code for every key when the probe failed."""
    if not keys:
        return []
    try:
        return [1 if hit else 0 for hit in client.exists_many(list(keys))]
    except CellarError as exc:
        return _all(len(keys), exc)
