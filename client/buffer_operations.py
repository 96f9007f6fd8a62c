"""The public operations over buffers engines already own: raw pointers, scatter-gather parts,
torch tensors. Each is a flow over the same put/get flows as `api` (one implementation for
both faces); this module only turns the caller's memory into checked views.

- Pointers: views over registered memory only (`cellar.client.pointers.PointerRegistry`); a
  range outside every registration is `cellar.InvalidArgument` before anything is sent, and the
  registrations a call uses cannot be unregistered until it returns.
- Parts: one object is its parts concatenated in order; a put sends them as they are (no
  staging copy), a get lands in them. Parts whose total differs from the object are refused
  (`BufferTooSmall` if they hold less, `InvalidArgument` if more) before any byte moves.
- Tensors (torch optional): the value is a small header (dtype, shape) then the elements
  (`cellar.client.tensors`), written as two parts from the tensor's own memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cellar.client import flows, one_put, one_read, operations, tensors
from cellar.client.buffers import alloc_buffer, readable_view, writable_view
from cellar.client.checks import validate_key, validate_keys, validate_replicas
from cellar.client.flows import Flow, Session
from cellar.client.gets import GetEntry, release_views
from cellar.client.pointers import Lease
from cellar.client.puts import parts_entries
from cellar.errors import InvalidArgument, Status

T = TypeVar("T")

MAX_PARTS = 1024  # parts of one object (each one iovec / one copy)


# ---- raw pointers -------------------------------------------------------------------------

def _leased(lease: Lease, nonempty: bool) -> list[memoryview]:
    views = []
    for i, view in enumerate(lease.views):
        if isinstance(view, InvalidArgument):
            lease.release()
            raise InvalidArgument(f"ptrs[{i}]: {view}") from None
        if nonempty and view.nbytes == 0:
            lease.release()
            raise InvalidArgument(f"sizes[{i}] is 0; Cellar stores values of at least 1 byte")
        views.append(view)
    return views


def _pointer_lists(keys: Any, ptrs: Any, sizes: Any, max_key_bytes: int) -> list[str]:
    names = validate_keys(keys, max_key_bytes)
    for what, seq in (("ptrs", ptrs), ("sizes", sizes)):
        operations.check_buffer_count(seq, len(names), what)
    return names


def one_put_from(s: Session, key: Any, ptr: Any, size: Any, *, replicas: Any = 1,
                 soft_pin: Any = False, upsert: Any = False) -> one_put.OnePut | None:
    """`put_from` as one write and one PutEnd (client/one_put.py), holding its lease of the
    range until the put's `done`; or None: the flow `put_from` then answers the call,
    argument errors included."""
    try:
        key = validate_key(key, s.limits.max_key_bytes)
        replicas = validate_replicas(replicas)
        lease = s.pointers.lease([ptr], [size], writable=False)
        (view,) = _leased(lease, nonempty=True)  # it releases the lease when it raises
    except InvalidArgument:
        return None
    return _held_until_done(lease, lambda done: one_put.plan(
        s, key, view, replicas=replicas, soft_pin=bool(soft_pin), upsert=bool(upsert),
        hints=None, done=done))


def put_from(s: Session, key: Any, ptr: Any, size: Any, *, replicas: Any = 1,
             soft_pin: Any = False, upsert: Any = False,
             deadline: float | None = None) -> Flow[None]:
    key = validate_key(key, s.limits.max_key_bytes)
    lease = s.pointers.lease([ptr], [size], writable=False)
    (view,) = _leased(lease, nonempty=True)
    try:
        yield from operations.put_one_view(s, key, view, replicas=replicas, soft_pin=soft_pin,
                                    upsert=upsert, deadline=deadline)
    finally:
        lease.release()


def put_many_from(s: Session, keys: Any, ptrs: Any, sizes: Any, *, replicas: Any = 1,
                  soft_pin: Any = False, upsert: Any = False) -> Flow[list[Status]]:
    names = _pointer_lists(keys, ptrs, sizes, s.limits.max_key_bytes)
    if len(set(names)) != len(names):
        raise InvalidArgument("a key appears twice in one batch")
    lease = s.pointers.lease(list(ptrs), list(sizes), writable=False)
    views = _leased(lease, nonempty=True)
    try:
        return (yield from operations.put_views(s, list(zip(names, views, strict=True)),
                                         replicas=replicas, soft_pin=soft_pin, upsert=upsert))
    finally:
        lease.release()


def one_get_into_ptr(s: Session, key: Any, ptr: Any, size: Any) -> one_read.OneRead | None:
    """`get_into_ptr` in one step (client/one_read.py: a trusted read, or one lookup and one
    read), holding its lease of the range until the read's `done`; or None: the flow
    `get_into_ptr` then answers the call, argument errors included."""
    try:
        key = validate_key(key, s.limits.max_key_bytes)
        lease = s.pointers.lease([ptr], [size], writable=True)
        (view,) = _leased(lease, nonempty=False)  # it releases the lease when it raises
    except InvalidArgument:
        return None
    return _held_until_done(lease, lambda done: one_read.plan(s, key, view, done))


def _held_until_done(lease: Lease, plan: Callable[[Callable[[], None]], T | None]) -> T | None:
    """`plan(done)`, `done` releasing `lease`: what it planned holds the lease until its
    `done`; when it planned nothing (or raised), the lease is released here."""
    try:
        one = plan(lease.release)
    except BaseException:
        lease.release()
        raise
    if one is None:
        lease.release()
    return one


def get_into_ptr(s: Session, key: Any, ptr: Any, size: Any,
                 deadline: float | None = None) -> Flow[int]:
    key = validate_key(key, s.limits.max_key_bytes)
    lease = s.pointers.lease([ptr], [size], writable=True)
    (view,) = _leased(lease, nonempty=False)
    try:
        return (yield from operations.get_into_view(s, key, view, deadline))
    finally:
        lease.release()


def get_many_into_ptrs(s: Session, keys: Any, ptrs: Any, sizes: Any, *, timeout_s: Any = None,
                       prefix: Any = False) -> Flow[list[int]]:
    names = _pointer_lists(keys, ptrs, sizes, s.limits.max_key_bytes)
    lease = s.pointers.lease(list(ptrs), list(sizes), writable=True)
    views = _leased(lease, nonempty=False)
    try:
        return (yield from operations.get_many_into_views(s, names, list(views), timeout_s=timeout_s,
                                                   prefix=prefix))
    finally:
        lease.release()


# ---- scatter-gather parts -----------------------------------------------------------------

def _parts(parts: Any, writable: bool, what: str) -> tuple[memoryview, ...]:
    if isinstance(parts, (bytes, bytearray, memoryview, str)) or not isinstance(parts, Sequence):
        raise InvalidArgument(f"{what} must be a sequence of buffers, not {type(parts).__name__}")
    if not parts or len(parts) > MAX_PARTS:
        raise InvalidArgument(f"{what} must hold 1 to {MAX_PARTS} buffers, got {len(parts)}")
    out: list[memoryview] = []
    for i, p in enumerate(parts):
        # The common case, kept lean (a layer_first batch is thousands of parts): a flat byte
        # view, checked as the generic path would, its error text built only when needed.
        if (type(p) is memoryview and p.ndim == 1 and p.format == "B" and p.c_contiguous
                and not (writable and p.readonly)):
            out.append(p)
        else:
            out.append(writable_view(p, f"{what}[{i}]") if writable
                       else readable_view(p, f"{what}[{i}]"))
    return tuple(out)


def _source_parts(parts: Any, what: str) -> tuple[memoryview, ...]:
    views = _parts(parts, False, what)
    if sum(v.nbytes for v in views) == 0:
        raise InvalidArgument(f"{what} are empty; Cellar stores values of at least 1 byte")
    return views


def put_parts(s: Session, key: Any, parts: Any, *, replicas: Any = 1, soft_pin: Any = False,
              upsert: Any = False, hints: Any = None) -> Flow[None]:
    key = validate_key(key, s.limits.max_key_bytes)
    (entry,) = parts_entries([(key, _source_parts(parts, "parts"))])
    yield from operations.put_one_entry(s, entry, replicas=replicas, soft_pin=soft_pin,
                                        upsert=upsert, hints=hints)


def put_many_parts(s: Session, items: Any, *, replicas: Any = 1, soft_pin: Any = False,
                   upsert: Any = False, hints: Any = None) -> Flow[list[Status]]:
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise InvalidArgument("items must be a sequence of (key, parts) pairs")
    checked: list[tuple[str, tuple[memoryview, ...]]] = []
    seen: set[str] = set()
    for i, pair in enumerate(items):
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidArgument(f"items[{i}] must be a (key, parts) pair")
        key = validate_key(pair[0], s.limits.max_key_bytes, f"items[{i}] key")
        if key in seen:
            raise InvalidArgument(f"items[{i}]: key {key!r} appears twice in one batch")
        seen.add(key)
        checked.append((key, _source_parts(pair[1], f"parts of {key!r}")))
    return (yield from operations.put_entries_flow(s, parts_entries(checked), replicas=replicas,
                                            soft_pin=soft_pin, upsert=upsert, hints=hints))


def get_into_parts(s: Session, key: Any, parts: Any) -> Flow[int]:
    key = validate_key(key, s.limits.max_key_bytes)
    return (yield from operations.get_into_view(s, key, _parts(parts, True, "parts")))


def get_many_into_parts(s: Session, keys: Any, parts_per_key: Any, *, timeout_s: Any = None,
                        prefix: Any = False) -> Flow[list[int]]:
    names = validate_keys(keys, s.limits.max_key_bytes)
    operations.check_buffer_count(parts_per_key, len(names), "parts_per_key")
    dests: list[Any] = [_parts(p, True, f"parts_per_key[{i}]")
                        for i, p in enumerate(parts_per_key)]
    return (yield from operations.get_many_into_views(s, names, dests, timeout_s=timeout_s,
                                               prefix=prefix))


# ---- torch tensors ------------------------------------------------------------------------

def _aligned(nbytes: int) -> tuple[memoryview, memoryview]:
    buf = alloc_buffer(nbytes)  # page-aligned: every dtype's elements land aligned
    return buf, buf


def put_tensor(s: Session, key: Any, t: Any, *, replicas: Any = 1, soft_pin: Any = False,
               upsert: Any = False) -> Flow[None]:
    key = validate_key(key, s.limits.max_key_bytes)
    (entry,) = parts_entries([(key, tuple(tensors.parts_for_put(t)))])
    yield from operations.put_one_entry(s, entry, replicas=replicas, soft_pin=soft_pin, upsert=upsert)


def put_tensors(s: Session, keys: Any, ts: Any, *, replicas: Any = 1, soft_pin: Any = False,
                upsert: Any = False) -> Flow[list[Status]]:
    names = validate_keys(keys, s.limits.max_key_bytes)
    operations.check_buffer_count(ts, len(names), "tensors")
    if len(set(names)) != len(names):
        raise InvalidArgument("a key appears twice in one batch")
    items = [(k, tuple(tensors.parts_for_put(t, f"tensors[{i}]")))
             for i, (k, t) in enumerate(zip(names, ts, strict=True))]
    return (yield from operations.put_entries_flow(s, parts_entries(items), replicas=replicas,
                                            soft_pin=soft_pin, upsert=upsert))


def _tensor_of(entry: GetEntry) -> Any:
    try:
        return tensors.tensor_from_value(entry.result, entry.size)
    finally:
        entry.view = entry.result = None


def get_tensor(s: Session, key: Any) -> Flow[Any]:
    key = validate_key(key, s.limits.max_key_bytes)
    (entry,) = yield from flows.run_gets(s, [key], None, s.deadline(), allocate=_aligned)
    yield operations.get_record([entry], s.tokens_per_key)
    if entry.status != Status.OK:
        release_views([entry])
        raise entry.error()
    return _tensor_of(entry)


def get_tensors(s: Session, keys: Any) -> Flow[list[Any]]:
    return (yield from operations.get_many_as(s, keys, _tensor_of, allocate=_aligned))


def get_tensor_into(s: Session, key: Any, t: Any) -> Flow[int]:
    key = validate_key(key, s.limits.max_key_bytes)
    dest = tensors.destination_for(t)
    size = yield from operations.get_into_view(s, key, tuple(dest.parts))
    dest.finish(size)
    return size


__all__ = [
    "get_into_parts", "get_into_ptr", "get_many_into_parts", "get_many_into_ptrs", "get_tensor",
    "get_tensor_into", "get_tensors", "put_from", "put_many_from", "put_many_parts",
    "put_parts", "put_tensor", "put_tensors",
]
