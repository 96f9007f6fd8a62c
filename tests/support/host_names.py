"""`loopback_host_name()`: this machine's host name and the loopback address it resolves to,
or None; for tests that must name a server by a host name rather than an IP literal.
"localhost" is never it: the etcd client library rewrites that one to 127.0.0.1 itself."""

from __future__ import annotations

import ipaddress
import socket


def loopback_host_name() -> tuple[str, str] | None:
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return None
    if name.startswith("localhost") or not ipaddress.ip_address(address).is_loopback:
        return None
    return name, address
