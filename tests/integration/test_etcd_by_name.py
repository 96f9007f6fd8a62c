"""A master given etcd by a name (not an IPv4 literal) campaigns there: etcd3aio writes every
target as `ipv4:HOST:PORT`, which gRPC refuses for a name, so `--etcd etcd:2379` (compose's)
or `--etcd cellar-etcd.kv.svc:2379` (the Helm chart's) never opened a session and no master
ever led (coord/election.py `_etcd_client`). Real etcd, a real master process."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cellar.coord.election import _etcd_client
from cellar.devtools.children import fetch_status
from cellar.devtools.etcd_server import EtcdServer
from cellar.devtools.ports import free_port
from tests.support.host_names import loopback_host_name

READY = re.compile(r"\(http (\S+), epoch")


def test_a_master_given_etcd_by_name_becomes_leader(tmp_path: Path) -> None:
    found = loopback_host_name()
    if found is None:
        pytest.skip(f"the host name {socket.gethostname()!r} does not resolve to a loopback address")
    name, address = found
    with EtcdServer(host=address) as etcd:
        port = free_port("127.0.0.1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "cellar", "master", "--listen", f"127.0.0.1:{port}",
             "--fast-port", "0", "--http", "127.0.0.1:0", "--advertise", f"127.0.0.1:{port}",
             "--etcd", f"{name}:{etcd.client_port}", "--cluster", "by-name",
             "--lease-ttl-s", "3"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
            env={**os.environ, "HOME": str(tmp_path)})
        try:
            assert proc.stdout is not None
            http = ""
            for line in proc.stdout:
                found = READY.search(line)
                if found:
                    http = found.group(1)
                    break
            assert http, f"no ready line (exit {proc.poll()})"
            deadline, role = time.monotonic() + 20, ""
            while time.monotonic() < deadline and role != "leader":
                role = str((fetch_status(http) or {}).get("role", ""))
                time.sleep(0.2)
            assert role == "leader", f"the master never led (role {role!r})"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_names_dial_one_endpoint_per_session_and_ips_keep_the_list() -> None:
    named = ("etcd-0.etcd:2379", "etcd-1.etcd:2379")
    assert _etcd_client(named, 0, None)._manager.target == "dns:///etcd-0.etcd:2379"
    assert _etcd_client(named, 1, None)._manager.target == "dns:///etcd-1.etcd:2379"
    assert _etcd_client(named, 2, None)._manager.target == "dns:///etcd-0.etcd:2379"
    ips = ("10.0.0.1:2379", "10.0.0.2:2379")
    assert _etcd_client(ips, 1, None)._manager.target == "ipv4:10.0.0.1:2379,10.0.0.2:2379"


@pytest.mark.parametrize("endpoint", ["localhost:2379", "[::1]:2379", "127.1:2379"])
def test_what_is_not_an_ipv4_literal_goes_through_dns(endpoint: str) -> None:
    assert _etcd_client((endpoint,), 0, None)._manager.target == f"dns:///{endpoint}"
