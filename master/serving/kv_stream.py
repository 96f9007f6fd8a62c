"""`WatchKvEvents`: the KV events as an authenticated gRPC server stream, one tenant's own.

The same batches the ZMQ publisher sends (master/serving/kv_events.py), for consumers inside the
auth model: the caller's token decides the tenant (a tenant token sees only its tenant; an admin
token names one in the header), so tenant A's events never reach tenant B's stream. Resumable:
`from_seq` > 0 starts at that batch of the tenant's stream (OUT_OF_RANGE when the master no longer
holds it, so the consumer knows to resync, e.g. with `lookup`); 0 starts with the next batch.

The generic gRPC interceptor only checks unary calls, so this handler runs `Authorizer.check`
itself before anything else, and again before each round of batches: a token revoked while
its stream is open ends the stream (UNAUTHENTICATED) instead of reading on. Each stream waits
on the hub's wakeup between flushes; it holds no state of the master's and sends at most
`replay_batches` batches per wakeup. A tenant has
at most `kv_events_max_streams_per_tenant` streams open (one more is RESOURCE_EXHAUSTED): each
is a task the master wakes on every flush, so their number is bounded like everything else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from cellar.master.service import RequestRejected
from cellar.master.serving.auth import Authorizer, AuthRefused
from cellar.master.serving.leadership import Leadership
from cellar.proto import cellar_pb2 as pb

METHOD = "WatchKvEvents"


def watch_handler(leadership: Leadership, authorizer: Authorizer,
                  rejection: Any) -> grpc.RpcMethodHandler[Any, Any]:
    open_streams: dict[str, int] = {}  # tenant -> its streams being served

    async def watch(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[pb.KvEventBatch]:
        if not isinstance(request, pb.KvEventsRequest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {METHOD} request")
        try:
            authorizer.check(METHOD, request)
            if not leadership.serving():
                await context.abort(grpc.StatusCode.UNAVAILABLE, leadership.redirect())
            tenant = leadership.service.tenant(request.header.tenant).name
        except (AuthRefused, RequestRejected) as exc:
            await context.abort(*rejection(exc))
        hub = leadership.kv_events
        if hub is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "KV events are off on this master (start it with --kv-events-bind)")
        epoch = leadership.epoch
        next_seq = request.from_seq or hub.last_seq(tenant) + 1
        if next_seq < hub.oldest(tenant):
            await context.abort(grpc.StatusCode.OUT_OF_RANGE,
                                f"batches before {hub.oldest(tenant)} of tenant {tenant!r} are no "
                                f"longer held (asked from {next_seq}); resync and watch from 0")
        limit = leadership.config.kv_events_max_streams_per_tenant
        if open_streams.get(tenant, 0) >= limit:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"tenant {tenant!r} has {limit} KV event streams open "
                                "(kv_events_max_streams_per_tenant); close one first")
        open_streams[tenant] = open_streams.get(tenant, 0) + 1
        try:
            while True:
                wakeup = hub.wakeup  # taken before reading, so no flush slips between
                for seq, payload in hub.since(tenant, next_seq):
                    yield pb.KvEventBatch(seq=seq, payload=payload, epoch=epoch)
                    next_seq = seq + 1
                await wakeup.wait()
                try:  # a token revoked since the last round reads no more (a cached lookup)
                    authorizer.check(METHOD, request)
                except AuthRefused as exc:
                    await context.abort(*rejection(exc))
        finally:
            left = open_streams[tenant] - 1
            if left:
                open_streams[tenant] = left
            else:
                del open_streams[tenant]

    return grpc.unary_stream_rpc_method_handler(
        watch, request_deserializer=_parse, response_serializer=pb.KvEventBatch.SerializeToString)


def _parse(data: bytes) -> Any:
    try:
        return pb.KvEventsRequest.FromString(data)
    except Exception:  # noqa: BLE001 - answered INVALID_ARGUMENT by the handler
        return None
