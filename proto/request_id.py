"""Request ids as a wire contract: which master RPCs carry one and what it promises.

Every mutating client RPC names a `RequestHeader.request_id` (nonzero, unique per client id,
chosen by the client; 0 means "none": the call is not protected). A master that already
answered (token, tenant, client id, request id) answers a repeat of it with the same reply
instead of running it again, so a call carried twice (a reply lost after the master acted, the
fast line then gRPC, a retry, a redirect) returns the first call's result, never
ALREADY_EXISTS or NOT_FOUND for the caller's own earlier attempt. A repeat of the same id for
another method is refused (INVALID_ARGUMENT). The master remembers replies for a bounded time
and count (`request_id_memory_*`); they are not kept across a master restart or failover.

The SDK draws one id per logical call (`cellar.client.request_ids`) and the master keeps its
memory in `cellar.master.serving.request_memory`; both read the method set here.
"""

from __future__ import annotations

# The RPCs whose repeat must not run twice. GetReplicas is one: each run makes a pin, and a
# pin the caller never heard of holds its object unevictable until the pin TTL (seen: one
# leaked pin per get whose reply was lost). Probes (Exists, PrefixLen, Lookup, ListKeys,
# ClusterStatus) change nothing, are safe to run again and carry no id.
MUTATING_METHODS: frozenset[str] = frozenset({
    "PutStart", "PutEnd", "PutRevoke", "Remove", "RemovePrefix", "RemoveAll", "Unpin",
    "GetReplicas",
})

MAX_REQUEST_ID = (1 << 64) - 1  # a uint64 field

__all__ = ["MAX_REQUEST_ID", "MUTATING_METHODS"]
