"""What both faces do the same way at connect: arguments, the client id, the master address.

What it owns
    `ConnectArgs` (every `connect`/`connect_async` argument checked once, the credential
    resolved), the per-process client id pins and puts are attributed to, parsing of the
    master address ("host:port" or "etcd://..."), and the error a missing transport raises.

What it must never do
    Talk to the master (the faces do, with their own channel).
"""

from __future__ import annotations

import os
import secrets
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from cellar.client.checks import (
    resolve_token,
    transport_names,
    validate_tenant,
    validate_timeout,
)
from cellar.coord.target import EtcdTarget, is_etcd_url, parse_etcd_url
from cellar.errors import InvalidArgument
from cellar.proto import cellar_pb2 as pb
from cellar.units import parse_host_port

_PROCESS_CLIENT_ID: tuple[int, str] | None = None

T = TypeVar("T")


def client_id() -> str:
    """Stable for this process (pins and puts are attributed to it); renewed after fork."""
    global _PROCESS_CLIENT_ID
    pid = os.getpid()
    if _PROCESS_CLIENT_ID is None or _PROCESS_CLIENT_ID[0] != pid:
        _PROCESS_CLIENT_ID = (pid, f"{socket.gethostname()}/{pid}/{secrets.token_hex(4)}")
    return _PROCESS_CLIENT_ID[1]


def parse_master_address(address: str) -> EtcdTarget | None:
    """None for a master's "host:port", the etcd target for "etcd://HOST:PORT[,...]/CLUSTER";
    `cellar.InvalidArgument` for anything else."""
    if is_etcd_url(address):
        return parse_etcd_url(address)
    try:
        if "://" in address:
            raise ValueError("only etcd:// addresses have a scheme")
        parse_host_port(address)
    except ValueError:
        raise InvalidArgument(f"address must be 'host:port' or 'etcd://HOST:PORT[,...]/CLUSTER', "
                              f"got {address!r}") from None
    return None


@dataclass(frozen=True, slots=True)
class ConnectArgs:
    address: str
    target: EtcdTarget | None
    tenant: str
    token: str
    timeout_s: float
    transport: str

    @classmethod
    def check(cls, address: Any, tenant: Any, token: Any, timeout_s: Any,
              transport: Any) -> ConnectArgs:
        if not isinstance(address, str):
            raise InvalidArgument(f"address must be a 'host:port' str, not {type(address).__name__}")
        target = parse_master_address(address)
        tenant = validate_tenant(tenant)
        timeout_s = validate_timeout(timeout_s)
        transport_names(transport)  # refuse unknown names before opening anything
        return cls(address, target, tenant, resolve_token(address, token), timeout_s, transport)

    def header(self) -> Any:
        return pb.RequestHeader(tenant=self.tenant, client_id=client_id(), token=self.token)


def opened(open_all: Callable[..., list[T]], choice: str, address: str,
           spin: Any = None) -> list[T]:
    """`cellar.transfer.open_transports` (or its asyncio form) for `transport=choice`, with
    a transport this machine lacks reported as `cellar.InvalidArgument`. Nodes that serve
    their data port over TLS (endpoint `tls://HOST:PORT`) are verified against the CA of the
    master at `address` (`tls_ca_for`), else the system's trust store: never plaintext.
    `spin` (a `cellar.transfer.spin_wait.SpinWait`, sync face only) lets tcp poll for replies."""
    from cellar.transfer import TransportUnavailable

    tls_ca = tls_ca_for(address)
    options: dict[str, Any] = {} if spin is None else {"spin": spin}
    if tls_ca:
        from cellar.transfer.tls_sock import client_context

        options["tls_context"] = client_context(tls_ca)
    try:
        return open_all(choice, **options)
    except (TransportUnavailable, ValueError) as exc:
        raise InvalidArgument(str(exc)) from None


def tls_ca_for(address: str) -> str | None:
    """The CA file to verify the master at `address` with ($CELLAR_TLS_CA, else the token
    file's "tls_ca": `cellar.credentials`, sec-identity's), or None for plaintext."""
    try:
        from cellar.credentials import default_tls_ca  # type: ignore[import-not-found]
    except ImportError:  # sec-identity's module not installed: plaintext, as before it
        return None
    found = default_tls_ca(address)
    return found if isinstance(found, str) and found else None


def tls_context(tls_ca: str | None) -> ssl.SSLContext | None:
    """The client TLS context for the fast line (same certificate as the gRPC port)."""
    if not tls_ca:
        return None
    from cellar.tls import client_context  # type: ignore[import-not-found]

    context: ssl.SSLContext = client_context(tls_ca)
    return context


def master_channel(address: str, options: list[tuple[str, Any]], *,
                   aio: bool = False) -> tuple[Any, str | None]:
    """(gRPC channel to the master at `address`, its CA file or None): over TLS when a CA is
    known for it, for the sync face (`grpc`) or the asyncio one (`grpc.aio`)."""
    import grpc
    import grpc.aio

    tls_ca = tls_ca_for(address)
    if tls_ca:
        from cellar.tls import read_pem  # type: ignore[import-not-found]

        credentials = grpc.ssl_channel_credentials(root_certificates=read_pem(tls_ca))
        make_secure = grpc.aio.secure_channel if aio else grpc.secure_channel
        return make_secure(address, credentials, options=options), tls_ca
    make = grpc.aio.insecure_channel if aio else grpc.insecure_channel
    return make(address, options=options), None
