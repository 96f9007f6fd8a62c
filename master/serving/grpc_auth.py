"""The gRPC check in front of every master handler: who the caller is, before the handler runs.

What it owns: `AuthInterceptor`, which wraps each unary handler of the servicer once (cached by
method) so that `Authorizer.check` (cellar.master.serving.auth) judges the parsed request (its
`RequestHeader.token`, or on the node_listen port the verified client certificate) and the
handler then runs with `CURRENT_IDENTITY` set. Refusals are answered as the servicer answers
domain errors (`rejection`) and counted in the RPC's failures.

It must not import client code; it holds no state but the wrapped handlers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from cellar.master.serving.auth import CURRENT_IDENTITY, AuthRefused, node_id_of_peer
from cellar.master.serving.servicer import Malformed, MasterServicer, rejection
from cellar.refusals import PEER


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """The one gRPC check in front of every handler: `Authorizer.check` on the parsed request
    (the token is `RequestHeader.token`), then the handler with `CURRENT_IDENTITY` set. A
    refusal is answered through `rejection` and counted in the RPC's failures."""

    def __init__(self, servicer: MasterServicer, *, mtls: bool = False) -> None:
        self._servicer = servicer
        self._mtls = mtls  # a node_listen port exists: read verified peer certificates
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        wrapped = self._wrap(method.rpartition("/")[2], handler)
        self._wrapped[method] = wrapped
        return wrapped

    def _wrap(self, name: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        inner: Any = handler.unary_unary  # an async handler on grpc.aio (the stubs say sync)
        assert inner is not None
        check = self._servicer.authorizer.check
        stats = self._servicer.stats.get(name)
        mtls = self._mtls

        async def checked(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if type(request) is Malformed:  # no header to read: the handler says INVALID_ARGUMENT
                return await inner(request, context)
            # Only the node_listen port asks for a certificate, and gRPC verified it against
            # tls_client_ca_file before this runs; other ports carry no x509 fields.
            peer = node_id_of_peer(context.auth_context().get("x509_common_name", [])) if mtls else ""
            # refusal lines name the address, not the port (each RPC runs in its own task)
            PEER.set(context.peer().partition(":")[2].rpartition(":")[0].strip("[]"))
            try:
                identity = check(name, request, peer)
            except AuthRefused as exc:
                if stats is not None:
                    stats.requests += 1
                    stats.failures += 1
                await context.abort(*rejection(exc))
            token = CURRENT_IDENTITY.set(identity)
            try:
                return await inner(request, context)
            finally:
                CURRENT_IDENTITY.reset(token)

        return grpc.unary_unary_rpc_method_handler(
            checked, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
