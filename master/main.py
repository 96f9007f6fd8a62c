"""`cellar master`: load the config, start gRPC + HTTP on one event loop, tick, stop on a signal.

Prints exactly one line to stdout when it is ready to serve, which scripts and tests wait for:
    cellar master listening on HOST:PORT (http HOST:PORT, epoch N)
(ports are the bound ones, so port 0 works). SIGINT/SIGTERM stop it cleanly with exit 0; an
invalid configuration exits 2 naming the field; an address that cannot be bound exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import time

import grpc

from cellar.config import add_arguments, from_cli
from cellar.errors import ConfigError
from cellar.lifecycle import die_with_parent_if_asked
from cellar.master.admin import build_http
from cellar.master.config import ENV_PREFIX, MasterConfig
from cellar.master.fastrpc import FastRpcServer
from cellar.master.metrics import make_registry
from cellar.master.service import MasterService
from cellar.master.servicer import MasterServicer
from cellar.secret import load_cluster_secret
from cellar.units import parse_host_port

log = logging.getLogger("cellar.master")


def _freeze_heap() -> None:
    """Keep the cyclic GC from rescanning the whole object table.

    The metadata is millions of long-lived objects that never form garbage cycles (dropping an
    object unlinks it from every table, so reference counting frees it). Left alone, CPython's
    oldest-generation collections walk all of them: ~1 s pauses at 10^6 objects, growing with
    the table. So each tick collects the young generations (short-lived cycles from gRPC and
    asyncio die there) and moves the survivors to the permanent generation, which collections
    skip. Cost: O(objects created since the last tick).
    """
    gc.collect(1)
    gc.freeze()


async def _ticker(service: MasterService, interval_s: float) -> None:
    """Run the background sweeps every `interval_s`; the lateness of each wake-up is loop lag."""
    loop = asyncio.get_running_loop()
    expected = loop.time() + interval_s
    while True:
        await asyncio.sleep(max(0.0, expected - loop.time()))
        woke = loop.time()
        lag = max(0.0, woke - expected)
        expected = woke + interval_s
        try:
            service.tick(lag)
        except Exception:  # a bug in a sweep must not stop liveness tracking
            log.exception("background tick failed")
        _freeze_heap()


async def serve(config: MasterConfig, secret: bytes, *, ready: asyncio.Event | None = None) -> int:
    service = MasterService(config, secret)
    servicer = MasterServicer(service)
    registry = make_registry(service, servicer.stats)

    limit = config.grpc_max_message_bytes
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.so_reuseport", 0),
    ])
    servicer.add_to_server(server)
    host, port = parse_host_port(config.listen)
    try:
        bound = server.add_insecure_port(config.listen)
    except RuntimeError as exc:
        print(f"cellar master: cannot listen on {config.listen}: {exc}", file=sys.stderr)
        return 1
    if not bound:
        print(f"cellar master: cannot listen on {config.listen}", file=sys.stderr)
        return 1
    http = build_http(service, registry)
    http_host, http_port = parse_host_port(config.http)
    try:
        http_bound = await http.start(http_host, http_port)
    except OSError as exc:
        print(f"cellar master: cannot serve HTTP on {config.http}: {exc.strerror}", file=sys.stderr)
        return 1
    await server.start()
    fast = FastRpcServer(servicer, limit)
    try:
        servicer.fast_port = await fast.start(host)
    except OSError as exc:  # gRPC alone still serves everything
        log.warning("metadata fast line not started on %s: %s", host, exc.strerror)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ticker = asyncio.create_task(_ticker(service, config.tick_interval_s))
    print(
        f"cellar master listening on {host}:{bound} (http {http_host}:{http_bound}, epoch {service.epoch})",
        flush=True,
    )
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        await fast.close()
        await server.stop(grace=0.5)
        await http.stop()
    return 0


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> int:
    die_with_parent_if_asked()
    parser = argparse.ArgumentParser(
        prog="cellar master",
        description="Run the Cellar metadata master (gRPC + HTTP /metrics and admin API).",
    )
    add_arguments(parser, MasterConfig)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    config = from_cli(MasterConfig, args, env_prefix=ENV_PREFIX)  # exits on --print-config/errors
    try:
        secret = load_cluster_secret(config.cluster_secret_file or None)
    except ConfigError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    if os.environ.get("CELLAR_NO_UVLOOP") != "1":
        _install_uvloop()
    started = time.monotonic()
    try:
        code = asyncio.run(serve(config, secret))
    except KeyboardInterrupt:
        code = 0
    log.debug("master ran %.1f s", time.monotonic() - started)
    return code


if __name__ == "__main__":
    sys.exit(main())
