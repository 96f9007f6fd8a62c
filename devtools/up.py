"""`cellar up`: start a `LocalCluster` (cellar.devtools.local_cluster) and keep it running until Ctrl-C
or SIGTERM, printing where everything is: addresses, status pages, the credentials file that
`cellar.connect` and the CLI pick up, and the logs. It owns only the command line and the
banner; the cluster itself, its tokens and its TLS files are LocalCluster's.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from cellar.credentials import credentials_path
from cellar.devtools.etcd_server import EtcdError
from cellar.devtools.local_cluster import (
    DEFAULT_CLUSTER_NAME,
    DEFAULT_LEASE_TTL_S,
    DEFAULT_START_TIMEOUT_S,
    ClusterError,
    LocalCluster,
)
from cellar.http_fetch import base_url
from cellar.units import format_size, parse_size_bytes


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cellar up",
        description="Start a local Cellar cluster (a master and N storage nodes on 127.0.0.1; "
                    "with --ha: etcd, 2 masters and the nodes) and keep it running until Ctrl-C "
                    "or SIGTERM.")
    parser.add_argument("--nodes", type=int, default=2, help="storage nodes (default 2)")
    parser.add_argument("--segment-size", default="1GiB", help="DRAM per node (default 1GiB)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=50051,
                        help="master gRPC port (with --ha: of master-0; master-i gets PORT+i); "
                             "0 = any free port (default 50051)")
    parser.add_argument("--http-port", type=int, default=9400,
                        help="master status/metrics port (with --ha: HTTP_PORT+i); 0 = any (default 9400)")
    parser.add_argument("--run-dir", default=".cellar/up", help="where the logs go (default .cellar/up)")
    parser.add_argument("--start-timeout", type=float, default=DEFAULT_START_TIMEOUT_S,
                        help=f"seconds to wait for every process to be ready (default {DEFAULT_START_TIMEOUT_S:g})")
    parser.add_argument("--tls", action="store_true",
                        help="gRPC, the metadata fast line and the nodes' data ports over TLS "
                             "with a throwaway CA "
                             "(needs the cryptography package: pip install 'cellar-kv[tls]')")
    ha = parser.add_argument_group("high availability")
    ha.add_argument("--ha", action="store_true",
                    help="start etcd and several masters (one leads, the others stand by)")
    ha.add_argument("--masters", type=int, default=2, help="masters with --ha (default 2)")
    ha.add_argument("--etcd-port", type=int, default=2379,
                    help="etcd client port with --ha; 0 = any free port (default 2379)")
    ha.add_argument("--cluster", default=DEFAULT_CLUSTER_NAME,
                    help=f"cluster name in etcd with --ha (default {DEFAULT_CLUSTER_NAME!r})")
    ha.add_argument("--lease-ttl-s", type=int, default=DEFAULT_LEASE_TTL_S,
                    help=f"leader lease in etcd, whole seconds (default {DEFAULT_LEASE_TTL_S})")
    ha.add_argument("--etcd-tls", action="store_true",
                    help="etcd speaks only TLS and asks for client certificates (a CA of its "
                    "own); the banner prints what a client then sets (CELLAR_ETCD_*)")
    args = parser.parse_args(argv)
    try:
        segment_bytes = parse_size_bytes(args.segment_size)
    except ValueError as exc:
        parser.error(str(exc))
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    for name in ("port", "http_port", "etcd_port"):
        if not 0 <= getattr(args, name) <= 65535:
            parser.error(f"--{name.replace('_', '-')} must be 0..65535")
    if args.ha and not 1 <= args.masters <= 9:
        parser.error("--masters must be 1..9")
    if args.etcd_tls and not args.ha:
        parser.error("--etcd-tls needs --ha (only an HA cluster uses etcd)")

    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    if args.tls or args.etcd_tls:
        try:
            import cryptography  # noqa: F401  (only to say what is missing before starting)
        except ImportError:
            parser.error("--tls and --etcd-tls need the cryptography package: "
                         "pip install 'cellar-kv[tls]'")
    cluster = LocalCluster(args.nodes, segment_bytes, host=args.host, port=args.port,
                           http_port=args.http_port, run_dir=Path(args.run_dir).resolve(),
                           start_timeout_s=args.start_timeout, ha=args.ha,
                           masters=args.masters if args.ha else None,
                           cluster_name=args.cluster, etcd_port=args.etcd_port,
                           lease_ttl_s=args.lease_ttl_s, tls=args.tls, etcd_tls=args.etcd_tls)
    code = 0
    try:
        what = (f"etcd, {args.masters} masters" if args.ha else "a master")
        print(f"starting {what} and {args.nodes} node(s) of {format_size(segment_bytes)} "
              f"(logs in {cluster.run_dir})...", flush=True)
        cluster.start()
        print(_up_banner(cluster, args.nodes, segment_bytes), flush=True)
        reported: set[str] = set()
        while True:
            time.sleep(0.5)
            for child in cluster.dead_children():
                if child.name not in reported:
                    reported.add(child.name)
                    print(f"cellar up: {child.describe_exit()}", file=sys.stderr, flush=True)
            if not cluster.ha and "master" in reported:
                print("cellar up: the master is gone; stopping the cluster",
                      file=sys.stderr, flush=True)
                code = 1
            elif cluster.ha and all(m.name in reported for m in cluster.masters):
                print("cellar up: every master is gone; stopping the cluster",
                      file=sys.stderr, flush=True)
                code = 1
            elif cluster.etcd is not None and not cluster.etcd.alive():
                print(f"cellar up: {cluster.etcd.describe_exit()}\ncellar up: etcd is gone; "
                      "stopping the cluster", file=sys.stderr, flush=True)
                code = 1
            if code:
                break
    except KeyboardInterrupt:
        pass
    except (ClusterError, EtcdError) as exc:
        print(f"cellar up: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
    if code == 0:
        print("cellar up: stopped", flush=True)
    return code


def _up_banner(cluster: LocalCluster, nodes: int, segment_bytes: int) -> str:
    address = cluster.address
    try_line = (f"  try:     python -c \"import cellar; c = cellar.connect('{address}'); "
                f"c.put('k', b'v'); print(c.get('k'))\"\n")
    if not cluster.ha:
        return (f"Cellar is up: master {address}, {nodes} node(s) x {format_size(segment_bytes)}\n"
                f"  status:  {cluster.http_url}/  (JSON {cluster.http_url}/api/v1/status, "
                f"metrics {cluster.http_url}/metrics)\n"
                f"           cellar status --master {address}\n"
                f"{try_line}"
                f"{_credentials_line(cluster)}"
                f"  logs:    {cluster.run_dir}\n"
                f"Ctrl-C stops the cluster.")
    leader = cluster.leader()
    masters = "\n".join(
        f"           {m.name} {m.address} (http {base_url(m.http)}/api/v1/status)"
        f"{'  <- leader' if i == leader else ''}" for i, m in enumerate(cluster.masters))
    return (f"Cellar is up (high availability): {len(cluster.masters)} masters, {nodes} node(s) x "
            f"{format_size(segment_bytes)}\n"
            f"  connect: {address}   (clients and nodes find the leader through etcd)\n"
            f"  etcd:    {cluster.etcd.client_url if cluster.etcd else '?'}\n"
            f"{_etcd_tls_line(cluster)}"
            f"  masters:\n{masters}\n"
            f"  status:  cellar status --master {address}\n"
            f"{try_line}"
            f"{_credentials_line(cluster)}"
            f"  logs:    {cluster.run_dir}\n"
            f"Ctrl-C stops the cluster.")


def _etcd_tls_line(cluster: LocalCluster) -> str:
    if not cluster.etcd_env:
        return ""
    settings = " ".join(f"{k}={v}" for k, v in sorted(cluster.etcd_env.items()))
    return f"  etcd TLS: clients set {settings}\n"


def _credentials_line(cluster: LocalCluster) -> str:
    tls = f"; TLS, CA {cluster.tls.ca_file}" if cluster.tls is not None else ""
    return (f"  tokens:  {credentials_path(cluster.address)} (admin + default tenant, 0600; "
            f"`cellar token --help`{tls})\n")
