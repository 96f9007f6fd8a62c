"""Flows over a tenant's key space: removes and listing (the SDK's `remove*`, `list_keys`).

What it owns
    Each public remove and list call as a generator of `Rpc` effects (client/flows.py says
    how a face performs them), checked replies, and the early-read bookkeeping a remove needs:
    before it, this client trusts none of the keys' old places (`Locations.changing`); once
    the master acknowledged it, the places it remembers for them are forgotten
    (`Locations.forget`).

What it must never do
    Block, sleep or touch a socket.
"""

from __future__ import annotations

from itertools import pairwise

from cellar.client.checks import batch_ranges
from cellar.client.flows import Flow, Rpc, Session
from cellar.client.statuses import check_result_count, status_error, to_status
from cellar.errors import CellarError, InvalidArgument, Status
from cellar.proto import cellar_pb2 as pb


def _changing(s: Session, keys: list[str] | None) -> None:
    """Before a remove: this client trusts none of its old places (early_reads.py)."""
    if s.locations is not None:
        s.locations.changing(keys)


def remove(s: Session, key: str) -> Flow[bool]:
    _changing(s, [key])
    reply = yield Rpc("Remove", pb.KeysRequest(header=s.header, keys=[key]), s.deadline())
    check_result_count("Remove", len(reply.results), 1)
    status = to_status(reply.results[0].status)
    if status == Status.OK:
        if s.locations is not None:
            s.locations.forget(key)
        return True
    if status == Status.NOT_FOUND:
        return False
    raise status_error(status, reply.results[0].message, key)


def remove_many(s: Session, keys: list[str]) -> Flow[list[bool]]:
    """Remove several keys, in batches of the master's `max_batch_keys`: True where a key was
    there, False where not; any other per-key status raises."""
    out: list[bool] = []
    _changing(s, keys)
    for span in batch_ranges(len(keys), s.limits.max_batch_keys):
        names = keys[span.start:span.stop]
        reply = yield Rpc("Remove", pb.KeysRequest(header=s.header, keys=names), s.deadline())
        check_result_count("Remove", len(reply.results), len(names))
        for key, result in zip(names, reply.results, strict=True):
            status = to_status(result.status)
            if status not in (Status.OK, Status.NOT_FOUND):
                raise status_error(status, result.message, key)
            out.append(status == Status.OK)
        if s.locations is not None:
            s.locations.forget(*names)
    return out


def remove_prefix(s: Session, prefix: str) -> Flow[int]:
    _changing(s, None)
    reply = yield Rpc("RemovePrefix", pb.RemovePrefixRequest(header=s.header, prefix=prefix),
                      s.deadline())
    return int(reply.removed)


def remove_all(s: Session, tenant: str | None) -> Flow[int]:
    """RemoveAll for this session's tenant, or for `tenant` (the master lets only an admin
    token name a tenant other than its own: PermissionDenied otherwise)."""
    header = s.header
    if tenant is not None and tenant != header.tenant:
        header = pb.RequestHeader()
        header.CopyFrom(s.header)
        header.tenant = tenant
    _changing(s, None)
    reply = yield Rpc("RemoveAll", pb.RemoveAllRequest(header=header), s.deadline())
    return int(reply.removed)


def list_keys(s: Session, prefix: str, start_after: str, limit: int) -> Flow[tuple[list[str], bool]]:
    """One ListKeys page (keys in ascending str order, and whether more match), checked: at
    most `limit` keys, ascending, each after `start_after` and starting with `prefix`; a
    page that says `more` holds `limit` keys, so a walk always moves on."""
    request = pb.ListKeysRequest(header=s.header, prefix=prefix, start_after=start_after,
                                 limit=limit)
    reply = yield Rpc("ListKeys", request, s.deadline())
    keys = list(reply.keys)
    more = bool(reply.more)
    ordered = all(a < b for a, b in pairwise([start_after, *keys]))
    if (len(keys) > limit or (more and len(keys) < limit) or not ordered
            or not all(k.startswith(prefix) for k in keys)):
        raise CellarError(f"ListKeys: the master answered a page of {len(keys)} keys "
                          f"(limit {limit}, more={more}) out of order or off its prefix")
    return keys, more


def list_all_keys(s: Session, prefix: str, page_keys: int, max_keys: int) -> Flow[list[str]]:
    """Every key under `prefix`, page by page; InvalidArgument once more than `max_keys` match.
    Bounded: a page that says `more` holds `page_keys` keys (checked by `list_keys`), so a walk
    asks at most max_keys // page_keys + 1 pages and holds at most max_keys + page_keys keys."""
    out: list[str] = []
    start_after = ""
    more = True
    while more:
        keys, more = yield from list_keys(s, prefix, start_after, page_keys)
        out.extend(keys)
        if len(out) > max_keys:
            raise InvalidArgument(
                f"more than {max_keys} keys start with {prefix!r} (the list_all_keys cap, in "
                f"keys): walk them page by page with list_keys(start_after=...)")
        if keys:
            start_after = keys[-1]
    return out
