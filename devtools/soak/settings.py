"""The soak's fixed settings and its command line.

What it owns
    The bounds every part of a soak run waits within (recovery, settling, the final pass, the
    leader wait after a leader fault), the short liveness settings the soak's master runs with
    (`MASTER_FLAGS`: nodes SUSPECT after 1 s and EXPIRED after 3 s, so faults show within a
    run), the fault kinds of a single-master and of an HA run, and `build_parser`: the flags of
    `cellar soak` and the hidden ones of worker mode (`--worker --id ... --master ...`).

What it must never do
    Hold state or do I/O: every other soak module imports it.
"""

from __future__ import annotations

import argparse

from cellar.devtools.soak.kinds import BOTH, FACES, TRANSPORTS

KIB = 1 << 10
MIB = 1 << 20

FAULT_KINDS = ("node_kill_restart", "node_stop", "master_kill_restart", "master_stop")
HA_FAULT_KINDS = ("node_kill_restart", "node_stop", "leader_kill_restart", "leader_stop",
                  "etcd_outage")
DEFAULT_LEASE_TTL_S = 3
LEADER_WAIT_S = 30.0           # a new leader must be serving within this after a leader fault
ETCD_OUTAGE_MAX_FRACTION = 0.6  # of the lease: an outage the leader must ride out
# A leader stop lasts this long past 1.5-2.5 leases, so a standby that takes over at the end
# of what a kill -9 showed still does so while the leader is stopped: after a kill the standby
# led 3.4-4.7 s later (lease 3 s) in the HA soaks of 2026-12-05 (the lease runs up to a TTL
# past the last renewal, then etcd revokes it through a raft commit, which a busy 2-core
# machine delays), while a stop of 1.5 leases left it 4.5 s; one stop of 4.7 s saw no takeover.
LEADER_STOP_ALLOWANCE_S = 2.0
MASTER_FLAGS = {
    "node_suspect_after_s": 1, "node_expire_after_s": 3, "pin_ttl_s": 3,
    "write_grant_ttl_s": 5, "heartbeat_interval_s": 0.3, "new_node_ramp_s": 0,
    "rebuild_grace_s": 5,
}
CLIENT_TIMEOUT_S = 15.0
PROGRESS_INTERVAL_S = 10.0
STATS_INTERVAL_S = 2.0
ERROR_SAMPLES_PER_KIND = 3   # the first distinct messages of each error kind, in the report
ERROR_SAMPLE_CHARS = 300     # of each message
WATCH_INTERVAL_S = 0.5
HTTP_TIMEOUT_S = 1.0
RECOVERY_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 90.0
WORKER_FINISH_TIMEOUT_S = 300.0
FINAL_PASS_ATTEMPTS = 5
MAX_BATCH_KEYS = 8           # keys in one batched operation of a worker (--batch-share)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cellar soak",
        description="Run random checksummed traffic from several client processes against a "
                    "local cluster while killing, stopping and restarting its nodes and master; "
                    "exit 1 on any corrupt read, stale read or unexplained loss (with --ha also when no "
                    "standby took over from a stopped leader, or a short etcd outage deposed it).")
    parser.add_argument("--duration", default="600s", help="how long the load runs (default 600s)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--nodes", type=int, default=3, help="storage nodes (default 3)")
    parser.add_argument("--segment-size", default="256MiB", help="DRAM per node (default 256MiB)")
    parser.add_argument("--disk-size", default="",
                        help="give every node a disk tier of this size (docs/disk-tier.md) in "
                             "the run's folder, so DRAM pressure demotes objects to disk and "
                             "reads promote them back while the faults run (default: none)")
    parser.add_argument("--chaos-interval", default="5s",
                        help="mean time between faults (default 5s)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--replicas", type=int, default=2, help="replicas per object (default 2)")
    parser.add_argument("--keys", type=int, default=64,
                        help="keys per client (default 64; sized so nothing needs evicting)")
    parser.add_argument("--min-size", default="1KiB", help="smallest value (default 1KiB)")
    parser.add_argument("--max-size", default="2MiB",
                        help="largest value (default 2MiB; sizes are log-uniform)")
    parser.add_argument("--page-size", default="64KiB",
                        help="a share of the writes (--page-share) is exactly this size, as an "
                             "engine's KV page: such puts write under put-ahead allocations "
                             "(docs/sdk.md; default 64KiB, within --min-size..--max-size)")
    parser.add_argument("--page-share", type=float, default=0.5,
                        help="the share of writes of --page-size (default 0.5; 0: none)")
    parser.add_argument("--batch-share", type=float, default=0.2,
                        help="the share of a client's steps that are batched operations "
                             "(get_many, put_many with and without upsert, remove_many) of 2-"
                             f"{MAX_BATCH_KEYS} of its keys, each key judged as its single "
                             "operation would be (default 0.2; 0: none)")
    parser.add_argument("--faces", choices=(BOTH, *FACES), default=BOTH,
                        help="which SDK face the clients drive: sync (cellar.Client), async "
                             "(cellar.AsyncClient, one call at a time on its own loop) or both "
                             "(odd-numbered clients async; default both)")
    parser.add_argument("--transports", choices=(BOTH, *TRANSPORTS), default=BOTH,
                        help="how the clients move bytes: auto (shared memory, all being on "
                             "one host), tcp, or both (clients 2-3 of every 4 on tcp; default "
                             "both)")
    parser.add_argument("--report", default="", help="write the counts as JSON to this file")
    parser.add_argument("--keep-run-dir", action="store_true",
                        help="keep the run's folder (every process's log, the journals) when "
                             "the soak passes too; a failed soak always keeps it")
    parser.add_argument("--ha", action="store_true",
                        help="etcd + --masters masters; the master faults become leader faults "
                             "(kill -9, SIGSTOP past the lease) and a brief etcd outage")
    parser.add_argument("--masters", type=int, default=2, help="masters with --ha (default 2)")
    parser.add_argument("--tls", action="store_true",
                        help="gRPC and the fast line over TLS (cellar up --tls; needs cryptography)")
    parser.add_argument("--lease-ttl-s", type=int, default=DEFAULT_LEASE_TTL_S,
                        help=f"leader lease with --ha, whole seconds (default {DEFAULT_LEASE_TTL_S})")
    # worker mode (internal)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--master", default="", help=argparse.SUPPRESS)
    parser.add_argument("--dir", default="", help=argparse.SUPPRESS)
    parser.add_argument("--load-until", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--run-id", default="", help=argparse.SUPPRESS)
    parser.add_argument("--face", choices=FACES, default="sync", help=argparse.SUPPRESS)
    parser.add_argument("--transport", choices=TRANSPORTS, default="auto", help=argparse.SUPPRESS)
    return parser
