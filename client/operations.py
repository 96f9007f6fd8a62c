"""The public SDK operations, each as one flow: argument checks, the protocol flow, the result.

`Client.get_many_into(...)` is `self._run(operations.get_many_into(self._session, ...))` and
`AsyncClient.get_many_into(...)` is `await self._run(...)` of the same flow: the two faces
cannot drift apart in what they accept, what they send or what they return. Argument errors
surface at the flow's first step, before any request leaves.

Per-key results of the batched `_into` gets: the size (>= 0), `MISS` (-1) or, for a
deadline-bounded call (`timeout_s` given), `LATE` (-2: not read within the budget). With
`prefix=True` the list is cut to the leading run of keys that were read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cellar.client import flows, key_flows, one_read
from cellar.client import one_put as one_put_step
from cellar.client.buffers import writable_view
from cellar.client.checks import (
    DEFAULT_MAX_LIST_KEYS,
    MAX_LIST_ALL_KEYS,
    normalize_items,
    validate_budget,
    validate_count,
    validate_key,
    validate_keys,
    validate_replicas,
    validate_tenant,
    validate_text,
    validate_value,
)
from cellar.client.flows import Flow, Record, Session
from cellar.client.gets import GetEntry, into_result, miss_or_raise, release_views, take_value
from cellar.client.puts import PutEntry, PutHints, put_entries
from cellar.client.statuses import LATE
from cellar.errors import InvalidArgument, Status

T = TypeVar("T")


def _statuses(entries: list[PutEntry]) -> list[Status]:
    return [e.status if e.status is not None else Status.INTERNAL for e in entries]


def _put_record(entries: list[PutEntry]) -> Record:
    stored = [e for e in entries if e.status in (Status.OK, Status.ALREADY_EXISTS)]
    return Record(len(entries), len(stored), sum(e.nbytes for e in entries
                                                 if e.status == Status.OK))


def get_record(entries: list[GetEntry], tokens_per_key: int | None = None) -> Record:
    hits = [e for e in entries if e.status == Status.OK]
    return Record(len(entries), len(hits), sum(e.size for e in hits),
                  late=sum(1 for e in entries if e.late),
                  refused=sum(1 for e in entries if e.refused),
                  cut=sum(1 for e in entries if e.cut), tokens_per_key=tokens_per_key)


# ---- put ----------------------------------------------------------------------------------

def put_views(s: Session, pairs: list[tuple[str, memoryview]], *, replicas: Any, soft_pin: Any,
              upsert: Any, hints: Any = None) -> Flow[list[Status]]:
    """Store checked (key, view) pairs; one status per pair (the batched put forms)."""
    return (yield from put_entries_flow(s, put_entries(pairs), replicas=replicas,
                                        soft_pin=soft_pin, upsert=upsert, hints=hints))


def check_hints(hints: Any, soft_pin: bool) -> PutHints | None:
    if hints is None:
        return None
    if not isinstance(hints, PutHints):
        raise InvalidArgument(f"hints must be a PutHints, not {type(hints).__name__}")
    return hints.check(soft_pin)


def put_entries_flow(s: Session, entries: list[PutEntry], *, replicas: Any, soft_pin: Any,
                     upsert: Any, hints: Any = None) -> Flow[list[Status]]:
    replicas = validate_replicas(replicas)
    hints = check_hints(hints, bool(soft_pin))
    entries = yield from flows.run_puts(s, entries, replicas=replicas, soft_pin=bool(soft_pin),
                                        upsert=bool(upsert), deadline=s.deadline(), hints=hints)
    yield _put_record(entries)
    return _statuses(entries)


def put_one_view(s: Session, key: str, view: memoryview, *, replicas: Any, soft_pin: Any,
                 upsert: Any, hints: Any = None, deadline: float | None = None) -> Flow[None]:
    """Store one checked value; raises the key's error (the single put forms). `deadline`:
    the call's, when a one-step put of it was tried first; else from now."""
    yield from put_one_entry(s, put_entries([(key, view)])[0], replicas=replicas,
                             soft_pin=soft_pin, upsert=upsert, hints=hints, deadline=deadline)


def put_one_entry(s: Session, entry: PutEntry, *, replicas: Any, soft_pin: Any,
                  upsert: Any, hints: Any = None, deadline: float | None = None) -> Flow[None]:
    replicas = validate_replicas(replicas)
    hints = check_hints(hints, bool(soft_pin))
    yield from flows.run_puts(s, [entry], replicas=replicas, soft_pin=bool(soft_pin),
                              upsert=bool(upsert), deadline=deadline or s.deadline(),
                              hints=hints)
    yield _put_record([entry])
    if entry.status != Status.OK:
        raise entry.error()


def one_put(s: Session, key: Any, value: Any, *, replicas: Any = 1, soft_pin: Any = False,
            upsert: Any = False, hints: Any = None) -> one_put_step.OnePut | None:
    """`put` as one write and one PutEnd (client/one_put.py), or None: the flow `put` then
    answers the call, argument errors included."""
    try:
        key = validate_key(key, s.limits.max_key_bytes)
        view = validate_value(value)
        replicas = validate_replicas(replicas)
        hints = check_hints(hints, bool(soft_pin))
    except InvalidArgument:
        return None
    return one_put_step.plan(s, key, view, replicas=replicas, soft_pin=bool(soft_pin),
                             upsert=bool(upsert), hints=hints)


def put(s: Session, key: Any, value: Any, *, replicas: Any = 1, soft_pin: Any = False,
        upsert: Any = False, hints: Any = None, deadline: float | None = None) -> Flow[None]:
    key = validate_key(key, s.limits.max_key_bytes)
    view = validate_value(value)
    yield from put_one_view(s, key, view, replicas=replicas, soft_pin=soft_pin, upsert=upsert,
                            hints=hints, deadline=deadline)


def put_many(s: Session, items: Any, *, replicas: Any = 1, soft_pin: Any = False,
             upsert: Any = False, hints: Any = None) -> Flow[list[Status]]:
    pairs = normalize_items(items, s.limits.max_key_bytes)
    return (yield from put_views(s, pairs, replicas=replicas, soft_pin=soft_pin, upsert=upsert,
                                 hints=hints))


# ---- get ----------------------------------------------------------------------------------

def one_get(s: Session, key: Any) -> one_read.OneRead | None:
    """`get` in one step into new bytes (client/one_read.py: a trusted read, or one lookup
    and one read), or None: the flow `get` then answers the call, argument errors included."""
    try:
        key = validate_key(key, s.limits.max_key_bytes)
    except InvalidArgument:
        return None
    return one_read.plan(s, key, None)


def get(s: Session, key: Any, deadline: float | None = None) -> Flow[bytes]:
    """(`deadline`: the call's, when a one-step read of it failed first; else from now.)"""
    key = validate_key(key, s.limits.max_key_bytes)
    (entry,) = yield from flows.run_gets(s, [key], None, deadline or s.deadline())
    yield get_record([entry], s.tokens_per_key)
    return value_or_raise(entry)


def get_each(s: Session, names: list[str], deadline: float | None = None
             ) -> Flow[list[GetEntry]]:
    """Entries for checked keys read into fresh bytes, one per key, for a face that turns
    each into its own `get` result (`value_or_raise`): the asyncio face coalesces the `get`
    calls made in one loop turn into one of these batches. `deadline` (monotonic s): a call's
    that began before (a lone get tried in one step first), else from now."""
    entries = yield from flows.run_gets(s, names, None, deadline or s.deadline())
    yield get_record(entries, s.tokens_per_key)
    return entries


def value_or_raise(entry: GetEntry) -> bytes:
    """`get`'s result for one entry: its bytes, or its error (NotFound, IntegrityError...)."""
    if entry.status != Status.OK:
        release_views([entry])
        raise entry.error()
    return take_value(entry)


def get_into_view(s: Session, key: str, dest: memoryview | tuple[memoryview, ...],
                  deadline: float | None = None) -> Flow[int]:
    """One key into a checked view, or into parts (a tuple of views); `deadline` as `get`."""
    (entry,) = yield from flows.run_gets(s, [key], [dest], deadline or s.deadline())
    yield get_record([entry], s.tokens_per_key)
    if entry.status != Status.OK:
        raise entry.error()
    return entry.size


def one_get_into(s: Session, key: Any, buffer: Any) -> one_read.OneRead | None:
    """`get_into` in one step (client/one_read.py: a trusted read, or one lookup and one
    read), or None: the flow `get_into` then answers the call, argument errors included
    (raised and counted there)."""
    try:
        key = validate_key(key, s.limits.max_key_bytes)
        view = writable_view(buffer, "buffer")
    except InvalidArgument:
        return None
    return one_read.plan(s, key, view)


def get_into(s: Session, key: Any, buffer: Any, deadline: float | None = None) -> Flow[int]:
    key = validate_key(key, s.limits.max_key_bytes)
    return (yield from get_into_view(s, key, writable_view(buffer, "buffer"), deadline))


def get_many(s: Session, keys: Any) -> Flow[list[bytes | None]]:
    return (yield from get_many_as(s, keys, take_value))


def get_many_as(s: Session, keys: Any, take: Callable[[GetEntry], T],
                allocate: Any = None) -> Flow[list[T | None]]:
    """Values for `keys` in input order, each made by `take` from its read entry (bytes,
    a tensor, ...); None for a miss; the entries' buffers are released either way."""
    names = validate_keys(keys, s.limits.max_key_bytes)
    entries = yield from flows.run_gets(s, names, None, s.deadline(), allocate=allocate)
    yield get_record(entries, s.tokens_per_key)
    try:
        for entry in entries:
            miss_or_raise(entry)
        return [take(e) if e.status == Status.OK else None for e in entries]
    finally:
        release_views(entries)


def check_buffer_count(buffers: Any, count: int, what: str = "buffers") -> None:
    if isinstance(buffers, (bytes, bytearray, memoryview, str)) or not hasattr(buffers, "__len__"):
        raise InvalidArgument(f"{what} must be a sequence with one {what.rstrip('s')} per key")
    if len(buffers) != count:
        raise InvalidArgument(f"{count} keys but {len(buffers)} {what}")


def get_many_into_views(s: Session, names: list[str], dests: list[Any], *,
                        timeout_s: Any = None, prefix: Any = False) -> Flow[list[int]]:
    """The batched `_into` gets over checked views (buffers, pointers and parts alike)."""
    budget_s = validate_budget(timeout_s)
    prefix = bool(prefix)
    if budget_s == 0:  # nothing is asked, nothing is read: every key is LATE at once
        yield Record(len(names), 0, tokens_per_key=s.tokens_per_key)
        return [] if prefix else [LATE] * len(names)
    deadline = s.deadline()
    budget_at = None if budget_s is None else time.monotonic() + budget_s
    if budget_at is not None:
        deadline = max(deadline, budget_at)  # the budget, not the client timeout, bounds it
    entries = yield from flows.run_gets(s, names, dests, deadline, budget_at=budget_at,
                                        prefix=prefix)
    yield get_record(entries, s.tokens_per_key)
    out = [into_result(e) for e in entries]
    if prefix:
        run = 0
        while run < len(out) and out[run] >= 0:
            run += 1
        return out[:run]
    return out + [LATE] * (len(names) - len(out))


def get_many_into(s: Session, keys: Any, buffers: Any, *, timeout_s: Any = None,
                  prefix: Any = False) -> Flow[list[int]]:
    names = validate_keys(keys, s.limits.max_key_bytes)
    check_buffer_count(buffers, len(names))
    dests = [writable_view(b, f"buffers[{i}]") for i, b in enumerate(buffers)]
    return (yield from get_many_into_views(s, names, dests, timeout_s=timeout_s, prefix=prefix))


def size(s: Session, key: Any) -> Flow[int]:
    key = validate_key(key, s.limits.max_key_bytes)
    return (yield from flows.size(s, key))


# ---- probes and removal -------------------------------------------------------------------

def exists_many(s: Session, keys: Any) -> Flow[list[bool]]:
    found = yield from flows.exists_many(s, validate_keys(keys, s.limits.max_key_bytes))
    yield Record(len(found), sum(found), tokens_per_key=s.tokens_per_key)
    return found


def exists(s: Session, key: Any) -> Flow[bool]:
    key = validate_key(key, s.limits.max_key_bytes)
    (found,) = yield from flows.exists_many(s, [key])
    yield Record(1, int(found), tokens_per_key=s.tokens_per_key)
    return found


def prefix_len(s: Session, keys: Sequence[Any]) -> Flow[int]:
    names = validate_keys(keys, s.limits.max_key_bytes)
    n = yield from flows.prefix_len(s, names)
    yield Record(len(names), n, tokens_per_key=s.tokens_per_key)
    return n


def remove(s: Session, key: Any) -> Flow[bool]:
    return (yield from key_flows.remove(s, validate_key(key, s.limits.max_key_bytes)))


def remove_many(s: Session, keys: Any) -> Flow[list[bool]]:
    return (yield from key_flows.remove_many(s, validate_keys(keys, s.limits.max_key_bytes)))


def remove_prefix(s: Session, prefix: Any) -> Flow[int]:
    prefix = validate_key(prefix, s.limits.max_key_bytes, "prefix")
    return (yield from key_flows.remove_prefix(s, prefix))


def remove_all(s: Session, tenant: Any = None) -> Flow[int]:
    return (yield from key_flows.remove_all(s, None if tenant is None else validate_tenant(tenant)))


def list_keys(s: Session, prefix: Any = "", start_after: Any = "",
              limit: Any = DEFAULT_MAX_LIST_KEYS) -> Flow[list[str]]:
    prefix = validate_text(prefix, s.limits.max_key_bytes, "prefix")
    start_after = validate_text(start_after, s.limits.max_key_bytes, "start_after")
    limit = validate_count(limit, s.limits.max_list_keys, "limit")
    keys, _more = yield from key_flows.list_keys(s, prefix, start_after, limit)
    return keys


def list_all_keys(s: Session, prefix: Any = "",
                  page_keys: Any = DEFAULT_MAX_LIST_KEYS) -> Flow[list[str]]:
    prefix = validate_text(prefix, s.limits.max_key_bytes, "prefix")
    page_keys = validate_count(page_keys, MAX_LIST_ALL_KEYS, "page_keys")
    # the page size changes only how many calls the walk takes: ask at most what the master serves
    page_keys = min(page_keys, s.limits.max_list_keys)
    return (yield from key_flows.list_all_keys(s, prefix, page_keys, MAX_LIST_ALL_KEYS))


def status(s: Session) -> Flow[dict[str, Any]]:
    return (yield from flows.cluster_status(s))
