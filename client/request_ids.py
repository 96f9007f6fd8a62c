"""One request id per logical master call (issue 19, finding 4; the contract: proto/request_id.py).

A mutating call (PutStart, PutEnd, PutRevoke, Remove, RemovePrefix, RemoveAll, Unpin, and
GetReplicas, which makes a pin) gets a
fresh nonzero id in its request header when a face's `MasterChannel.call` starts it; the face
then carries that same request message, id included, on every attempt: a retry after
UNAVAILABLE, a redirect to the leader, the fallback from the fast line to gRPC. The master
answers a repeat with the first call's reply, so a lost reply never turns the caller's own call
into ALREADY_EXISTS or NOT_FOUND.

Ids are unique per client id: one counter per process (the client id is per process too, see
`connect_args.client_id`), starting at a random point so that a restarted process (a new client
id anyway) or a forked one does not count from the same place. Thread-safe: `next` of an
`itertools.count` is atomic under the GIL. A caller that set an id itself keeps it.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any

from cellar.proto.request_id import MUTATING_METHODS

ENABLED = True  # tests turn it off to show what a repeat did before (the negative control)

_ids = itertools.count(1 + secrets.randbelow(1 << 62))


def stamp(method: str, request: Any) -> None:
    """Give a mutating call's request its id (once: a request already stamped keeps its id)."""
    if ENABLED and method in MUTATING_METHODS:
        header = request.header
        if not header.request_id:
            header.request_id = next(_ids)


__all__ = ["ENABLED", "stamp"]
