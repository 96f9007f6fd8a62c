"""`cellar master`: load the config, start gRPC + HTTP on one event loop, tick, stop on a signal.

Prints exactly one line to stdout when it is ready to serve, which scripts and tests wait for:
    cellar master listening on HOST:PORT (http HOST:PORT, epoch N)
(ports are the bound ones, so port 0 works). With `--etcd` (high availability) the master
starts as a standby (epoch 0 in that line), campaigns in etcd (cellar.coord.election) and
serves once it leads; `cellar.master.serving.leadership` holds the role and the live service. SIGINT/SIGTERM stop it cleanly with exit 0; an
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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from cellar.config import add_arguments, from_cli
from cellar.coord.etcd_tls import EtcdTls
from cellar.errors import ConfigError
from cellar.heap import freeze_survivors
from cellar.http_fetch import advertised
from cellar.lifecycle import die_with_parent_if_asked
from cellar.master.config import ENV_PREFIX, MasterConfig
from cellar.master.serving import removal_log, tenant_log
from cellar.master.serving.auth import Authorizer
from cellar.master.serving.fastrpc import FastRpcServer
from cellar.master.serving.grpc_auth import AuthInterceptor
from cellar.master.serving.http_api import build_http
from cellar.master.serving.kv_events_start import start_kv_events
from cellar.master.serving.leadership import Leadership
from cellar.master.serving.metrics import make_registry
from cellar.master.serving.servicer import MasterServicer
from cellar.master.serving.token_log import EtcdTokenLog
from cellar.secret import load_cluster_secret
from cellar.tls import read_pem, server_context
from cellar.tokens import DEFAULT_TOKENS_PATH, TokenStore, ensure_private
from cellar.units import WILDCARD_HOSTS, parse_host_port

if TYPE_CHECKING:
    from cellar.coord.election import LeaderElection

log = logging.getLogger("cellar.master")
GRPC_MAX_CONCURRENT_STREAMS = 256  # concurrent RPCs on one gRPC connection (HTTP/2 streams)


def _freeze_heap() -> None:
    """Keep the cyclic GC from rescanning the whole object table (cellar.heap).

    While the master serves, this is the only collection (`serve` turns the automatic one off):
    nearly everything the hot path allocates is table state that outlives every collection, so
    the automatic collector walked each object in the young and then the middle generation
    before a tick froze it, ~5% of PutStart+PutEnd. Every garbage cycle still dies within
    one tick interval.
    """
    freeze_survivors()


async def _ticker(leadership: Leadership, authorizer: Authorizer, interval_s: float) -> None:
    """Run the background sweeps every `interval_s`; the lateness of each wake-up is loop lag,
    and so is the whole time since the last one while the master cannot serve."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    expected = last + interval_s
    while True:
        await asyncio.sleep(max(0.0, expected - loop.time()))
        woke = loop.time()
        lag = max(0.0, woke - expected)
        if not leadership.serving():
            # A leader unsure of its lease (etcd away, the keep-alive late) refuses every
            # call, the nodes' heartbeats too: their silence meanwhile is its own, as a stalled
            # loop's is (membership.credit_lag). Uncredited, the nodes were SUSPECT when it
            # served again, and puts were refused for want of live nodes until their next
            # heartbeats (`cellar soak --ha`: 50 refused in 60 ms after an etcd outage).
            lag = max(lag, woke - last)
        last = woke
        expected = woke + interval_s
        try:
            leadership.service.tick(lag)  # the live service: a new one after each election
            leadership.tick()
            authorizer.refresh()  # a token created or revoked through another master or the file
        except Exception:  # a bug in a sweep must not stop liveness tracking
            log.exception("background tick failed")
        _freeze_heap()


def _single_master_file(config: MasterConfig, value: str, disabled: str,
                        default: Callable[[str], Path]) -> Path | None:
    """Where a single master keeps one of its logs (`value`, the setting), or None: with etcd
    (the log lives there), turned off (`disabled`), or on port 0 without a file set (a restart
    listens elsewhere, so no one could follow it anyway)."""
    if config.etcd or value == disabled or (not value and parse_host_port(config.listen)[1] == 0):
        return None
    return Path(value).expanduser() if value else default(config.listen)


async def serve(config: MasterConfig, secret: bytes, store: TokenStore, *,
                ready: asyncio.Event | None = None) -> int:
    leadership = Leadership(config, secret, ha=bool(config.etcd))
    single_master_logs: tuple[tuple[str, str, str, Callable[[str], Path], Callable[[Path], None]], ...] = (
        ("removal log", config.removal_log_file, removal_log.DISABLED, removal_log.default_path,
         lambda path: leadership.attach_removal_log(removal_log.FileRemovalLog(path))),
        ("tenant log", config.tenant_log_file, tenant_log.DISABLED, tenant_log.default_path,
         lambda path: leadership.attach_tenant_log(tenant_log.FileTenantLog(path))),
    )
    for what, value, disabled, default, attach in single_master_logs:
        path = _single_master_file(config, value, disabled, default)
        if path is None:
            continue
        try:
            attach(path)
        except OSError as exc:
            print(f"cellar master: cannot open the {what} {path}: {exc}", file=sys.stderr)
            return 2
        log.info("%s %s loaded", what, path)
    if isinstance(leadership.removal_log, removal_log.FileRemovalLog):
        log.info("removal log: %d removal bound(s) loaded", leadership.removal_log.records_written)
    authorizer = Authorizer(store, secret, refusal_log_interval_s=config.refusal_log_interval_s,
                            refuse_node_credentials=config.refuse_node_credentials)
    servicer = MasterServicer(leadership, authorizer)
    registry = make_registry(leadership, servicer.stats)
    registry.register(authorizer.collector())
    registry.register(servicer.requests.collector())

    limit = config.grpc_max_message_bytes
    server = grpc.aio.server(interceptors=[AuthInterceptor(servicer, mtls=bool(config.node_listen))], options=[
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.so_reuseport", 0),
        # gRPC has no per-peer connection limit (the fast line and the nodes do): it bounds
        # connections, closes those that never finish a handshake, idle ones and old ones,
        # and bounds streams per connection (master/config.py).
        ("grpc.max_allowed_incoming_connections", config.grpc_max_connections),
        ("grpc.server_handshake_timeout_ms", int(config.grpc_handshake_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(config.grpc_max_connection_idle_s * 1000)),
        ("grpc.max_connection_age_ms", int(config.grpc_max_connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(config.grpc_max_connection_age_grace_s * 1000)),
        ("grpc.max_concurrent_streams", GRPC_MAX_CONCURRENT_STREAMS),
    ])
    servicer.add_to_server(server)
    host, port = parse_host_port(config.listen)
    node_bound = 0
    try:
        if config.tls_cert_file:  # cellar.tls: the fast line below uses the same certificate
            bound = server.add_secure_port(config.listen, grpc.ssl_server_credentials(
                [(read_pem(config.tls_key_file), read_pem(config.tls_cert_file))]))
        else:
            bound = server.add_insecure_port(config.listen)
        if config.node_listen:  # mutual TLS for nodes: the interceptor reads the verified CN
            node_bound = server.add_secure_port(config.node_listen, grpc.ssl_server_credentials(
                [(read_pem(config.tls_key_file), read_pem(config.tls_cert_file))],
                root_certificates=read_pem(config.tls_client_ca_file), require_client_auth=True))
            if not node_bound:
                print(f"cellar master: cannot listen on {config.node_listen}", file=sys.stderr)
                return 1
    except OSError as exc:
        print(f"cellar master: cannot read the TLS files: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"cellar master: cannot listen on {config.listen}: {exc}", file=sys.stderr)
        return 1
    if not bound:
        print(f"cellar master: cannot listen on {config.listen}", file=sys.stderr)
        return 1
    publisher = start_kv_events(config, leadership, registry)
    http = build_http(leadership, registry, authorizer)
    http.set_limits(max_connections=config.http_max_connections,
                    max_connections_per_peer=config.http_max_connections_per_peer,
                    header_timeout_s=config.http_header_timeout_s,
                    refusal_log_interval_s=config.refusal_log_interval_s)
    registry.register(http.collector("master"))
    http_host, http_port = parse_host_port(config.http)
    try:
        http_bound = await http.start(http_host, http_port, server_context(
            config.tls_cert_file, config.tls_key_file) if config.http_tls else None)
    except OSError as exc:
        print(f"cellar master: cannot serve HTTP on {config.http}: {exc.strerror}", file=sys.stderr)
        return 1
    # https://... with TLS; a wildcard listen is named by the advertised host (etcd's record
    # sends callers there, and a certificate covers that name, not 0.0.0.0)
    http_named = advertised(_named_host(http_host, config.advertise), http_bound, config.http_tls)
    await server.start()
    fast = FastRpcServer(servicer, limit, max_connections_per_peer=config.max_connections_per_peer,
                         idle_timeout_s=config.idle_timeout_s,
                         frame_timeout_s=config.frame_timeout_s,
                         max_pending_bytes=config.max_pending_bytes)
    registry.register(fast.collector())
    try:
        servicer.fast_port = await fast.start(host, config.fast_port, server_context(
            config.tls_cert_file, config.tls_key_file) if config.tls_cert_file else None)
    except OSError as exc:  # gRPC alone still serves everything
        log.warning("metadata fast line not started on %s: %s", host, exc.strerror)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ticker = asyncio.create_task(_ticker(leadership, authorizer, config.tick_interval_s))
    campaign = None
    if leadership.ha:
        election = _election(config, leadership, f"{host}:{bound}", http_named, store)
        campaign = asyncio.create_task(election.run(stop))
    print(
        f"cellar master listening on {host}:{bound} (http {http_named}, epoch {leadership.epoch})"
        + (f" mtls nodes on {parse_host_port(config.node_listen)[0]}:{node_bound}" if config.node_listen else ""),
        flush=True,
    )
    if ready is not None:
        ready.set()
    gc.disable()  # the ticker collects (_freeze_heap); enabled again on the way out
    try:
        await stop.wait()
    finally:
        if campaign is not None:  # resigns: a standby takes over without waiting for the TTL
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(campaign, config.etcd_timeout_s * 2)
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        gc.enable()
        await fast.close()
        await server.stop(grace=0.5)
        await http.stop()
        if publisher is not None:
            publisher.stop()
    return 0


def _named_host(listen_host: str, advertise: str) -> str:
    """The host others reach a port listening on `listen_host` by: the advertised address's
    host when the listen host is a wildcard and one is advertised, else the listen host."""
    if listen_host in WILDCARD_HOSTS and advertise:
        return parse_host_port(advertise)[0]
    return listen_host


def _election(config: MasterConfig, leadership: Leadership, bound: str, http: str,
              store: TokenStore) -> LeaderElection:
    """Wire the etcd election to the leadership (cellar.coord.election, master/serving/leadership.py)."""
    from cellar.coord.election import LeaderElection
    from cellar.coord.target import EtcdTarget, LeaderRecord, parse_endpoints

    address = config.advertise or bound
    if parse_host_port(address)[0] in WILDCARD_HOSTS:
        log.warning("advertising %s, which others cannot reach: set --advertise", address)
    leadership.master_id = config.master_id or address
    election = LeaderElection(
        EtcdTarget(parse_endpoints(config.etcd), config.cluster),
        LeaderRecord(leadership.master_id, address, http, 0),
        lease_ttl_s=config.lease_ttl_s, etcd_timeout_s=config.etcd_timeout_s,
        on_elected=leadership.on_elected, on_deposed=leadership.on_deposed,
        on_leader=leadership.on_leader,
    )
    leadership.election = election
    leadership.attach_removal_log(removal_log.EtcdRemovalLog(election))
    leadership.attach_tenant_log(tenant_log.EtcdTenantLog(election))
    leadership.token_log = EtcdTokenLog(election, store)
    log.info("master %s campaigning in etcd %s for cluster %r (lease %d s)", leadership.master_id,
             config.etcd, config.cluster, config.lease_ttl_s)
    return election


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
        if config.etcd:
            EtcdTls.from_env()  # a bad TLS setting for etcd stops the start, not each session
        tokens_path = Path(config.tokens_file or DEFAULT_TOKENS_PATH).expanduser()
        ensure_private(tokens_path)
        store = TokenStore(tokens_path)
    except ConfigError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    if os.environ.get("CELLAR_NO_UVLOOP") != "1":
        _install_uvloop()
    started = time.monotonic()
    try:
        code = asyncio.run(serve(config, secret, store))
    except KeyboardInterrupt:
        code = 0
    log.debug("master ran %.1f s", time.monotonic() - started)
    return code


if __name__ == "__main__":
    sys.exit(main())
