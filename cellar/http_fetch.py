"""Asking a master's or a storage node's HTTP port: plain HTTP, or HTTPS when it serves TLS.

What it owns: the one way every HTTP caller in Cellar (`cellar status`, `cellar top`,
`cellar token`, the local cluster's probes, the soak's watcher, the benches) names and reaches
an HTTP port. An HTTP address is written `HOST:PORT` for plain HTTP or `https://HOST:PORT` for
a port that serves TLS (`http_tls`, docs/security.md): the form a master prints on its ready
line, advertises in etcd and names as the leader in its status, so a caller that follows it
(a standby's status to the leader, etcd's records) keeps the scheme. `http://HOST:PORT` is
taken too.

An https port is verified against a CA file: the caller's, else `$CELLAR_TLS_CA` (the one
clients verify the master's gRPC port with), else the `tls_ca` of the credentials file whose
`http` addresses name that port (`cellar up --tls` writes one), else the system's trust store.
Never falls back to plaintext, never skips verification.

It must not import the client, master or node rooms (it is the kernel's).
"""

from __future__ import annotations

import os
import ssl
import urllib.request
from typing import Any

from cellar.credentials import ENV_TLS_CA, credentials_files

HTTPS = "https://"
HTTP = "http://"
MAX_REPLY_BYTES = 16 << 20  # the most of an answer read (a large cluster's status JSON)


def is_tls(http: str) -> bool:
    """True for an address written `https://HOST:PORT`."""
    return http.startswith(HTTPS)


def host_port(http: str) -> str:
    """`HOST:PORT` of an HTTP address, whatever its scheme."""
    for scheme in (HTTPS, HTTP):
        if http.startswith(scheme):
            return http[len(scheme):].rstrip("/")
    return http


def advertised(host: str, port: int, tls: bool) -> str:
    """The address a server names for itself: `https://HOST:PORT` when it serves TLS."""
    return f"{HTTPS if tls else ''}{host}:{port}"


def base_url(http: str) -> str:
    """`http://HOST:PORT` or `https://HOST:PORT`, without a trailing slash."""
    return (HTTPS if is_tls(http) else HTTP) + host_port(http)


def default_ca(http: str) -> str | None:
    """$CELLAR_TLS_CA, else the "tls_ca" of the credentials file whose "http" addresses name
    the port of `http`, else None."""
    if os.environ.get(ENV_TLS_CA, "").strip():
        return os.environ[ENV_TLS_CA].strip()
    want = host_port(http)
    for creds in credentials_files():
        named = creds.get("http") or []
        ca = creds.get("tls_ca")
        if isinstance(ca, str) and ca.strip() and any(
                isinstance(a, str) and host_port(a) == want
                for a in ([named] if isinstance(named, str) else named)):
            return ca.strip()
    return None


def context(http: str, ca_file: str | None = None) -> ssl.SSLContext | None:
    """The client TLS context for `http` (None for plain HTTP): `ca_file`, else `default_ca`,
    else the system's trust store; the server's name is checked."""
    if not is_tls(http):
        return None
    ca = ca_file or default_ca(http)
    tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    tls.minimum_version = ssl.TLSVersion.TLSv1_2  # as every other Cellar port
    return tls


def fetch(http: str, path: str, *, timeout_s: float, max_bytes: int = MAX_REPLY_BYTES,
          method: str = "GET",
          data: bytes | None = None, headers: dict[str, str] | None = None,
          ca_file: str | None = None) -> bytes:
    """The body of `method path` at `http` (at most `max_bytes` of it). Raises what urllib
    raises: HTTPError (an answer other than 2xx, its body readable), URLError / OSError (no
    answer, or a TLS peer that failed verification), TimeoutError."""
    request = urllib.request.Request(base_url(http) + path, data=data, method=method,
                                     headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=timeout_s,
                                context=context(http, ca_file)) as reply:
        body: bytes = reply.read(max_bytes)
        return body


def fetch_json(http: str, path: str, **how: Any) -> Any:
    """`fetch`, parsed as JSON (ValueError if it is not)."""
    import json

    return json.loads(fetch(http, path, **how))
