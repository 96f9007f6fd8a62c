"""TLS on the TCP data plane (`cellar.transfer.tls_sock`): nodes of `LocalCluster(tls=True)`
serve their data port over TLS and advertise `tls://HOST:PORT`.

- the SDK's sync and async faces, forced onto tcp, move objects byte-exact (large ones
  striped over several connections, many small ones pipelined);
- shm puts still commit (the COMMIT line is that TLS port);
- what crosses the wire is TLS: a recording proxy in front of a TLS server sees no payload
  byte, where in front of a plaintext one it does (so the check can fail);
- a plaintext client gets no frame from a TLS node, and a client that does not trust the
  node's CA (or has no CA for it) cannot connect: it never falls back to plaintext.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.tls import TlsFiles, make_dev_pki
from cellar.transfer.base import ST_CONNECT_FAILED, ST_CONNECTION_LOST
from cellar.transfer.frame import (
    OP_PING,
    REQUEST,
    REQUEST_MAGIC,
    RESP_FLAG_CLOSE,
    RESPONSE,
    ST_OK,
    VERSION,
    decode_response,
)
from cellar.transfer.tcp import TcpTransport
from cellar.transfer.tcp_async import AsyncTcpTransport
from cellar.transfer.tcp_server import TcpDataServer
from cellar.transfer.tls_sock import (
    TLS_SCHEME,
    client_context,
    server_context,
    split_endpoint,
)
from tests.integration.cut_proxy import CutProxy
from tests.support.transfer_node import TransferNode, rop, route_to, wop

pytest.importorskip("cryptography")

MiB = 1 << 20


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "256MiB", tls=True) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_dev_pki(tmp_path_factory.mktemp("pki"), ["127.0.0.1"])


def _node_endpoint(cluster: LocalCluster) -> str:
    address = cluster.nodes[0].address
    assert address is not None
    return address


def test_nodes_advertise_tls_endpoints(tls_cluster: LocalCluster) -> None:
    with cellar.connect(tls_cluster.address, transport="tcp") as client:
        nodes = client.status()["nodes"]
    assert nodes and all(n["endpoints"]["tcp"].startswith(TLS_SCHEME) for n in nodes)
    assert _node_endpoint(tls_cluster).startswith(TLS_SCHEME)


def test_sync_face_over_tls_is_byte_exact(tls_cluster: LocalCluster) -> None:
    big = os.urandom(40 * MiB + 12345)  # > min_stripe_bytes: striped over connections
    small = {f"tls/s{i}": os.urandom(1000 + i) for i in range(64)}
    with cellar.connect(tls_cluster.address, transport="tcp") as client:
        client.put("tls/big", big)
        assert client.get("tls/big") == big
        dst = bytearray(len(big))
        assert client.get_into("tls/big", dst) == len(big) and dst == big
        statuses = client.put_many(list(small.items()))
        assert statuses == [cellar.Status.OK] * len(small)
        got = client.get_many(list(small))
        assert got == list(small.values())
        client.remove("tls/big")


def test_async_face_over_tls_is_byte_exact(tls_cluster: LocalCluster) -> None:
    big = os.urandom(24 * MiB + 7)
    small = [os.urandom(4096 + i) for i in range(32)]

    async def run() -> None:
        async with await cellar.connect_async(tls_cluster.address, transport="tcp") as client:
            await client.put("tls/abig", big)
            assert await client.get("tls/abig") == big
            await asyncio.gather(*(client.put(f"tls/a{i}", v) for i, v in enumerate(small)))
            got = await asyncio.gather(*(client.get(f"tls/a{i}") for i in range(len(small))))
            assert got == small
            await client.remove("tls/abig")

    asyncio.run(run())


def test_shm_commit_goes_over_tls(tls_cluster: LocalCluster) -> None:
    value = os.urandom(3 * MiB + 1)
    with cellar.connect(tls_cluster.address, transport="shm") as client:
        client.put("tls/shm", value)  # memcpy, then a COMMIT over the node's TLS port
        assert client.get("tls/shm") == value
    with cellar.connect(tls_cluster.address, transport="tcp") as client:
        assert client.get("tls/shm") == value  # committed: tcp reads it too


def test_plaintext_client_gets_no_frame_from_a_tls_node(tls_cluster: LocalCluster) -> None:
    host, port, tls = split_endpoint(_node_endpoint(tls_cluster))
    assert tls
    ping = REQUEST.pack(REQUEST_MAGIC, VERSION, OP_PING, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                        bytes(16), 0, 0)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(ping)
        try:
            reply = sock.recv(65536)
        except ConnectionError:
            reply = b""
    assert reply == b"" or reply[0] == 0x15  # closed, or a TLS alert record: never a frame
    plain = TcpTransport()
    try:
        with pytest.raises(ConnectionError):
            plain.ping(f"{host}:{port}", timeout_s=5)
        result = plain.read([rop(route_to(f"{host}:{port}"), 0, bytearray(16))], 5)[0]
        assert result.status == ST_CONNECTION_LOST
    finally:
        plain.close()


def test_untrusted_or_caless_clients_cannot_connect(tls_cluster: LocalCluster,
                                                    pki: TlsFiles) -> None:
    endpoint = _node_endpoint(tls_cluster)
    for context in (client_context(str(pki.ca_file)), None):  # another CA; system store
        transport = TcpTransport(tls_context=context)
        try:
            result = transport.read([rop(route_to(endpoint), 0, bytearray(16))], 5)[0]
            assert result.status == ST_CONNECT_FAILED
            assert "CERTIFICATE_VERIFY_FAILED" in result.message
        finally:
            transport.close()

    async def run() -> int:
        transport = AsyncTcpTransport(tls_context=client_context(str(pki.ca_file)))
        try:
            return (await transport.read([rop(route_to(endpoint), 0, bytearray(16))], 5))[0].status
        finally:
            await transport.aclose()

    assert asyncio.run(run()) == ST_CONNECT_FAILED


class _Recorder(CutProxy):
    """Forwards and keeps every byte that crossed, both ways (bounded by the test's sizes)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.seen = bytearray()
        self.seen_lock = threading.Lock()
        super().__init__(target)

    def _pump(self, src: socket.socket, dst: socket.socket, a: socket.socket,
              b: socket.socket, direction: str) -> None:
        try:
            while data := src.recv(1 << 16):
                with self.seen_lock:
                    self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        self.end_connection(a, b)


@pytest.mark.parametrize("tls", [True, False])
def test_no_payload_byte_crosses_the_wire_in_clear(pki: TlsFiles, tls: bool) -> None:
    marker = os.urandom(32)
    value = marker * (2 * MiB // len(marker))
    access = TransferNode(8 * MiB)
    context = server_context(str(pki.cert_file), str(pki.key_file)) if tls else None
    with TcpDataServer(access, "127.0.0.1", 0, ssl_context=context) as server:
        proxy = _Recorder(("127.0.0.1", server.port))
        transport = TcpTransport(tls_context=client_context(str(pki.ca_file)))
        try:
            route = route_to(f"{TLS_SCHEME if tls else ''}127.0.0.1:{proxy.port}")
            assert transport.write([wop(route, 0, value)], 10)[0].ok
            dst = bytearray(len(value))
            assert transport.read([rop(route, 0, dst)], 10)[0].ok and dst == value
        finally:
            transport.close()
            proxy.close()
    with proxy.seen_lock:
        seen = bytes(proxy.seen)
    assert len(seen) > 2 * len(value)  # both directions were recorded
    assert (marker in seen) is not tls


def test_a_malformed_frame_over_tls_gets_its_error_then_the_close(pki: TlsFiles) -> None:
    access = TransferNode(1 * MiB)
    context = server_context(str(pki.cert_file), str(pki.key_file))
    with TcpDataServer(access, "127.0.0.1", 0, ssl_context=context) as server:
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        with client_context(str(pki.ca_file)).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"XXXX" + bytes(REQUEST.size - 4))  # bad magic: fatal for the stream
            reply = bytearray()
            while len(reply) < RESPONSE.size:
                chunk = tls.recv(65536)
                if not chunk:
                    break
                reply += chunk
            head = decode_response(bytes(reply[:RESPONSE.size]), max_payload_bytes=1 << 20)
            assert head.status != ST_OK and head.flags & RESP_FLAG_CLOSE
            rest = reply[RESPONSE.size:]
            while chunk := tls.recv(65536):  # the message, then EOF (a timeout fails the test)
                rest += chunk
            assert len(rest) == head.msg_len > 0
        assert server.stats.snapshot()["requests"]["invalid"] == 1


def test_a_dripped_header_over_tls_meets_the_frame_deadline(pki: TlsFiles) -> None:
    """One byte a record, each well within the kernel timeout: only the per-frame deadline
    (`DeadlineInbox`, over a TLS socket's own timeout) can end it, long before the header."""
    context = server_context(str(pki.cert_file), str(pki.key_file))
    header = REQUEST.pack(REQUEST_MAGIC, VERSION, OP_PING, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                          bytes(16), 0, 0)
    with TcpDataServer(TransferNode(1 * MiB), "127.0.0.1", 0, ssl_context=context,
                       idle_timeout_s=1.0) as server:
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        with client_context(str(pki.ca_file)).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            sent = 0
            with pytest.raises(OSError):  # reset, or broken pipe, once the node closed
                for byte in header:
                    tls.sendall(bytes([byte]))
                    sent += 1
                    time.sleep(0.1)
                if not tls.recv(1):  # the whole header went through: the node must have closed
                    raise ConnectionResetError("closed")
            assert sent < len(header)


def test_a_stranger_evicted_during_its_tls_handshake_is_cut_at_once(pki: TlsFiles) -> None:
    """Wrapping a connection detaches its plain socket; an eviction (a newer connection of the
    same unproven address) used to shut that spent socket down, which did nothing: the
    evicted handshake ran on to its deadline, uncounted, so strangers could keep threads
    beyond max_connections_per_peer. Now the eviction reaches the TLS socket."""
    context = server_context(str(pki.cert_file), str(pki.key_file))
    with TcpDataServer(TransferNode(1 * MiB), "127.0.0.1", 0, ssl_context=context,
                       max_connections_per_peer=2, auth_timeout_s=30.0) as server:
        # a client of this address shows a grant first: its strangers then push out their
        # own oldest instead of being refused (transfer/tcp_admission.py)
        transport = TcpTransport(tls_context=client_context(str(pki.ca_file)))
        route = route_to(f"{TLS_SCHEME}127.0.0.1:{server.port}")
        assert transport.write([wop(route, 0, b"x" * 4096)], 10)[0].ok
        silent = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
                  for _ in range(2)]  # TCP up, no ClientHello: each handshake waits
        try:
            deadline = time.monotonic() + 5
            while server.stats.snapshot()["active_connections"] < 3:  # the client's and two
                assert time.monotonic() < deadline, "the two connections were never served"
                time.sleep(0.01)
            time.sleep(0.2)  # both threads are inside their handshakes by now
            silent.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
            silent[0].settimeout(5)
            assert silent[0].recv(1) == b""  # the oldest is closed well before its 30 s
            deadline = time.monotonic() + 5
            while server.stats.snapshot()["active_connections"] > 3:
                assert time.monotonic() < deadline, "the evicted handshake still runs"
                time.sleep(0.01)
        finally:
            for sock in silent:
                sock.close()
            transport.close()
