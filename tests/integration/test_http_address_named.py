"""The HTTP address a master or a storage node names for itself (a master's ready line and etcd
leader record, a node's ready line and status): a wildcard listen (`--http 0.0.0.0:PORT`, as
the Helm chart and compose run it) is named by the advertised host, which others can reach and
a TLS certificate covers; 0.0.0.0 is neither."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cellar.devtools.local_cluster import LocalCluster

READY = re.compile(r"cellar master listening on \S+ \(http (\S+), epoch")


def ready_http(tmp_path: Path, *flags: str) -> str:
    proc = subprocess.Popen([sys.executable, "-m", "cellar", "master", "--listen", "127.0.0.1:0",
                             "--fast-port", "0", *flags], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HOME": str(tmp_path)})
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            found = READY.search(line)
            if found:
                return found.group(1)
        pytest.fail(f"the master exited with {proc.wait()} before its ready line")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    raise AssertionError("unreachable")


def test_a_wildcard_http_listen_is_named_by_the_advertised_host(tmp_path: Path) -> None:
    http = ready_http(tmp_path, "--http", "0.0.0.0:0", "--advertise", "localhost:5999")
    host, _, port = http.rpartition(":")
    assert host == "localhost" and int(port) > 0


def test_a_named_http_listen_keeps_its_host(tmp_path: Path) -> None:
    http = ready_http(tmp_path, "--http", "127.0.0.1:0", "--advertise", "localhost:5999")
    assert http.startswith("127.0.0.1:")



def test_a_nodes_wildcard_http_listen_is_named_by_its_advertised_host() -> None:
    with LocalCluster(1, "64MiB", node_flags={"http": "0.0.0.0:0",
                                              "advertise_host": "localhost"}) as cluster:
        ready = next(line for line in cluster.nodes[0].log_path.read_text().splitlines()
                     if line.startswith("cellar node "))
        http = re.search(r"\(http (\S+), segments", ready).group(1)
        assert http.rpartition(":")[0] == "localhost", ready
