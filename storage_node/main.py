"""`cellar node`: parse the configuration, start a StorageNode, stop it on SIGINT/SIGTERM.

Prints exactly one ready line to stdout once the node's segments are mounted (tests and
`cellar up` wait for it):
    cellar node <node_id> serving tcp HOST:PORT (http HOST:PORT|off, segments N x SIZE) mounted on MASTER
where MASTER is the HOST:PORT of the master it mounted on (with etcd://..., the leader it found).
With --tls-cert-file the tcp address reads tls://HOST:PORT (what the node advertises).
Exit status: 0 after a clean stop, 1 if the node could not start, 2 for a bad configuration.
A master that is unreachable at start is waited for (a log line says so), never a reason to exit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from cellar.config import add_arguments, from_cli
from cellar.coord.etcd_tls import EtcdTls
from cellar.coord.target import is_etcd_url
from cellar.errors import ConfigError
from cellar.lifecycle import die_with_parent_if_asked
from cellar.secret import load_cluster_secret
from cellar.storage_node.config import ENV_PREFIX, NodeConfig
from cellar.storage_node.node import StorageNode
from cellar.storage_node.segment import SegmentError

READY_PREFIX = "cellar node "


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cellar node",
        description="Run a storage node: contribute DRAM segments and serve the data plane.",
    )
    add_arguments(parser, NodeConfig)
    parser.add_argument("--segment-size", dest="cfg_segment_size_bytes", default=None,
                        help="alias of --segment-size-bytes (e.g. 4GiB)")
    parser.add_argument("--disk-size", dest="cfg_disk_size_bytes", default=None,
                        help="alias of --disk-size-bytes (e.g. 64GiB)")
    return parser


async def _serve(node: StorageNode) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def ready() -> None:
        print(node.ready_line(), flush=True)

    await node.run(stop, ready)


def main(argv: list[str] | None = None) -> int:
    die_with_parent_if_asked()
    args = build_parser().parse_args(argv)
    cfg = from_cli(NodeConfig, args, env_prefix=ENV_PREFIX)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format=f"%(asctime)s node {cfg.node_id} %(levelname)s %(name)s: %(message)s",
    )
    try:
        secret = load_cluster_secret(cfg.cluster_secret_file or None)
        if is_etcd_url(cfg.master):
            EtcdTls.from_env()  # a bad TLS setting for etcd stops the start, not each lookup
    except ConfigError as exc:
        print(f"cellar node: invalid configuration: {exc}", file=sys.stderr)
        return 2
    node = StorageNode(cfg, secret)
    # Until the event loop takes over SIGTERM, turn it into KeyboardInterrupt so a node stopped
    # while it is still creating segments cleans up like any other stop.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        try:
            node.open()
        except (SegmentError, OSError) as exc:
            print(f"cellar node: cannot start: {exc}", file=sys.stderr)
            return 1
        asyncio.run(_serve(node))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut cleanup short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        node.close()
    return 0


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
