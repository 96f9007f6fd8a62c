"""A fault-injecting proxy between a client and the master that loses the first reply of every
call, on gRPC and on the fast line alike (issue 19, finding 4: a call carried twice).

`LostReplies(master_address, fast_port)` listens on two loopback ports:
- gRPC (`address`): every call is forwarded to the master, which acts on it; the first time a
  request body is seen on gRPC its reply is thrown away and the caller gets UNAVAILABLE, as
  when a connection breaks after the master answered. A repeat (the same bytes) is answered.
  ClusterStatus's trailing metadata is rewritten to name the proxy's fast line port;
- the fast line (`fast_port`): frames are forwarded one by one; the first time a request body
  is seen on the fast line the master's reply is dropped and the connection closed (the client
  falls back to gRPC, where the call's first reply is lost once more).

A call is known by its method and its serialized request, so a client that carries one call
again sends the same bytes; two logical calls with the same bytes would be taken for one (the
SDK's request ids make them differ).
"""

from __future__ import annotations

import socket
import threading
from concurrent import futures
from typing import Any

import grpc

from cellar.proto.fastline import FRAME
from cellar.proto.fastline import PORT_METADATA as FAST_PORT_METADATA
from tests.support.sockets import recv_exactly


class LostReplies:
    def __init__(self, master_address: str, fast_port: int) -> None:
        self.master_address = master_address
        self.fast_target = (master_address.rsplit(":", 1)[0], fast_port)
        self.lock = threading.Lock()
        self.seen_grpc: set[tuple[str, bytes]] = set()
        self.seen_fast: set[tuple[int, bytes]] = set()
        self.dropped: dict[str, int] = {"grpc": 0, "fast": 0}
        self.calls: dict[str, int] = {}  # method -> requests forwarded (both lines)
        self._channel = grpc.insecure_channel(master_address)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self._server.add_generic_rpc_handlers((_Forward(self),))
        self.grpc_port = self._server.add_insecure_port("127.0.0.1:0")
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.fast_port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._server.start()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def close(self) -> None:
        self._server.stop(0)
        self._listener.close()
        for sock in list(self._socks):
            sock.close()
        self._channel.close()

    def _first(self, seen: set[Any], call: Any, line: str, method: str) -> bool:
        with self.lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            if call in seen:
                return False
            seen.add(call)
            self.dropped[line] += 1
            return True

    # ---- gRPC ----------------------------------------------------------------------------

    def forward(self, method: str, body: bytes, context: grpc.ServicerContext) -> bytes:
        name = method.rpartition("/")[2]
        rpc = self._channel.unary_unary(method)  # bytes in, bytes out
        timeout = context.time_remaining()
        try:
            reply, call = rpc.with_call(body, timeout=timeout)
        except grpc.RpcError as exc:
            metadata = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
            if metadata:
                context.set_trailing_metadata(tuple(metadata))
            context.abort(exc.code(), exc.details() or "")
        metadata = [(k, v) for k, v in (call.trailing_metadata() or ()) if k != FAST_PORT_METADATA]
        if name == "ClusterStatus":
            metadata.append((FAST_PORT_METADATA, str(self.fast_port)))
        if self._first(self.seen_grpc, (method, body), "grpc", name):
            context.abort(grpc.StatusCode.UNAVAILABLE, "test proxy: the reply was lost")
        context.set_trailing_metadata(tuple(metadata))
        return reply  # type: ignore[no-any-return]

    # ---- the fast line --------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.fast_target)
        except OSError:
            client.close()
            return
        self._socks += [client, upstream]
        try:
            while True:
                head = recv_exactly(client, FRAME.size)
                length, method = FRAME.unpack(head)
                body = recv_exactly(client, length)
                upstream.sendall(head + body)
                reply_head = recv_exactly(upstream, FRAME.size)
                reply = recv_exactly(upstream, FRAME.unpack(reply_head)[0])
                if self._first(self.seen_fast, (method, body), "fast", f"fast:{method}"):
                    return  # the master acted; its reply never reaches the client
                client.sendall(reply_head + reply)
        except (OSError, ConnectionError):
            pass
        finally:
            client.close()
            upstream.close()


class _Forward(grpc.GenericRpcHandler):
    def __init__(self, proxy: LostReplies) -> None:
        self.proxy = proxy

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = details.method  # type: ignore[attr-defined]

        def handle(body: bytes, context: grpc.ServicerContext) -> bytes:
            return self.proxy.forward(method, body, context)

        return grpc.unary_unary_rpc_method_handler(handle)

