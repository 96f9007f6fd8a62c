"""Helpers shared by the flood tests (test_port_floods.py, test_log_flood.py): a one-node
cluster whose node serves /metrics, read one metric from a /metrics page, and tell whether the
server closed a socket."""

from __future__ import annotations

import re
import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cellar.devtools.etcd_server import free_port
from cellar.devtools.local_cluster import LocalCluster


@contextmanager
def metered_cluster(segment_size: str, master_flags: dict[str, Any],
                    node_flags: dict[str, Any]) -> Iterator[tuple[LocalCluster, str]]:
    """A started one-node LocalCluster and its node's /metrics URL; stopped on the way out."""
    node_http = f"127.0.0.1:{free_port('127.0.0.1')}"
    cluster = LocalCluster(1, segment_size, master_flags=master_flags,
                           node_flags={**node_flags, "http": node_http})
    cluster.start()
    try:
        yield cluster, f"http://{node_http}/metrics"
    finally:
        cluster.stop()


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` that carry these labels, from a /metrics page."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    want = {f'{k}="{v}"' for k, v in labels.items()}
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name and want <= set((m.group(2) or "").split(",")):
            total += float(m.group(3))
    return total


def still_open(sock: socket.socket) -> bool:
    """Whether the server has not closed `sock` (a closed one reads EOF or a reset); the
    socket is left non-blocking."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
