"""The command lines of a local cluster's children: what `LocalCluster` passes each master and node.

What it owns
    The flags every child of one `cellar.devtools.local_cluster.LocalCluster` gets: the
    addresses, the token store and TLS files its masters share, a single master's removal log
    in the run directory (so it survives the master's restarts), an HA master's etcd, cluster
    name, advertised address and lease, a node's segment size, shm directory, master address
    and mutual-TLS certificate; then the caller's own `master_flags` / `node_flags`, each
    `name=value` passed as `--name value` (underscores become dashes), last so they win.

What it must never do
    Start, wait for or signal a process (local_cluster.py and children.py do that); import the
    master, node or client code.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from cellar.devtools.etcd_server import EtcdServer
from cellar.tls import TlsFiles


class LocalCluster(Protocol):
    """What the command lines read of `cellar.devtools.local_cluster.LocalCluster` (a
    protocol, not an import: that module imports this one)."""

    host: str
    port: int
    http_port: int
    node_port: int
    run_dir: Path
    shm_dir: Path
    tokens_path: Path
    tls: TlsFiles | None
    etcd: EtcdServer | None
    cluster_name: str
    lease_ttl_s: int
    segment_size_bytes: int
    master_flags: dict[str, Any]
    node_flags: dict[str, Any]

    @property
    def address(self) -> str: ...


def flags(settings: Mapping[str, Any]) -> list[str]:
    """`{"lease_ttl_s": 3}` -> `["--lease-ttl-s", "3"]`."""
    argv: list[str] = []
    for name, value in settings.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


def shared_master_flags(cluster: LocalCluster) -> list[str]:
    """--tokens-file (unless the caller brings its own store) and, with tls, the certificate
    flags and HTTPS: what every master of this cluster shares."""
    argv = [] if "tokens_file" in cluster.master_flags else ["--tokens-file", str(cluster.tokens_path)]
    if cluster.tls is not None:  # the HTTP port too (https://, cellar.http_fetch)
        argv += ["--tls-cert-file", str(cluster.tls.cert_file),
                 "--tls-key-file", str(cluster.tls.key_file), "--http-tls", "true"]
    return argv


def master_argv(cluster: LocalCluster) -> list[str]:
    """The single master's command line."""
    c = cluster
    argv = ["master", "--listen", f"{c.host}:{c.port}", "--http", f"{c.host}:{c.http_port}",
            *shared_master_flags(c)]
    if c.tls is not None and c.node_port:
        argv += ["--tls-client-ca-file", str(c.tls.ca_file),
                 "--node-listen", f"{c.host}:{c.node_port}"]
    if "removal_log_file" not in c.master_flags:  # survives the master's restarts
        argv += ["--removal-log-file", str(c.run_dir / "master-removals.log")]
    if "tenant_log_file" not in c.master_flags:  # so are the tenants the admin API created
        argv += ["--tenant-log-file", str(c.run_dir / "master-tenants.json")]
    return argv + flags(c.master_flags)


def ha_master_argv(cluster: LocalCluster, index: int, grpc_port: int, http_port: int) -> list[str]:
    """Master `index` of an HA cluster on its fixed ports."""
    c = cluster
    assert c.etcd is not None
    address = f"{c.host}:{grpc_port}"
    argv = ["master", "--listen", address, "--http", f"{c.host}:{http_port}",
            "--etcd", c.etcd.client_address, "--cluster", c.cluster_name,
            "--advertise", address, "--master-id", f"master-{index}",
            "--lease-ttl-s", str(c.lease_ttl_s), *shared_master_flags(c)]
    return argv + flags(c.master_flags)


def node_argv(cluster: LocalCluster, index: int, extra_flags: Mapping[str, Any]) -> list[str]:
    """Node `index`'s command line (`node_id` in the flags names it, else `node-<index>`)."""
    c = cluster
    settings = {**c.node_flags, **extra_flags}
    node_id = str(settings.pop("node_id", f"node-{index}"))
    master = c.address
    argv = ["--segment-size", str(c.segment_size_bytes), "--node-id", node_id,
            "--shm-dir", str(c.shm_dir)]
    if c.tls is not None:  # the data port over TLS too, from the same throwaway CA
        argv += ["--tls-cert-file", str(c.tls.node_cert_file),
                 "--tls-key-file", str(c.tls.node_key_file), "--http-tls", "true"]
        client = c.tls.node_client_files(node_id)
        if client is not None and c.node_port:  # mutual TLS: no node credential sent
            master = f"{c.host}:{c.node_port}"
            argv += ["--master-tls-cert-file", str(client[0]),
                     "--master-tls-key-file", str(client[1])]
    return ["node", "--master", master, "--listen", f"{c.host}:0", *argv, *flags(settings)]


__all__ = ["flags", "ha_master_argv", "master_argv", "node_argv", "shared_master_flags"]
