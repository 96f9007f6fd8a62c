"""`assert_etcd_refuses_strangers`: an etcd client port that speaks TLS only and answers only
clients whose certificate its CA signed, checked over real sockets (its /health endpoint): the
deploy tests run it against compose's etcd and against the Helm chart's rendered etcd command."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REFUSED = (urllib.error.URLError, ConnectionError, OSError)


def assert_etcd_refuses_strangers(host_port: str, ca_file: str | Path, cert_file: str | Path,
                                  key_file: str | Path, timeout_s: float = 5.0) -> None:
    """Plaintext to `host_port` gets no HTTP answer, TLS without a certificate is refused, TLS
    with `cert_file` (verified against `ca_file`) is answered healthy."""
    with pytest.raises(REFUSED), \
            urllib.request.urlopen(f"http://{host_port}/health", timeout=timeout_s) as reply:
        reply.read()
    context = ssl.create_default_context(cafile=str(ca_file))
    with pytest.raises(REFUSED), \
            urllib.request.urlopen(f"https://{host_port}/health", timeout=timeout_s,
                                   context=context) as reply:
        reply.read()
    context.load_cert_chain(str(cert_file), str(key_file))
    with urllib.request.urlopen(f"https://{host_port}/health", timeout=timeout_s,
                                context=context) as reply:
        assert json.loads(reply.read())["health"] == "true"
