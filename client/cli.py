"""`cellar status | put | get | rm`: quick checks against a running cluster from the shell.

Each command connects with the public SDK (besides the SDK, only `cellar status` reads the
masters' HTTP status), does one thing and exits: 0 on success, 1 when the cluster said no
(not found, exists, no space, unreachable), 2 for bad usage. Errors are one line on stderr,
never a traceback.

The master address comes from `--master`, else `CELLAR_MASTER`, else 127.0.0.1:50051; it may be
`etcd://HOST:PORT[,...]/CLUSTER` (the SDK finds and follows the leader). The tenant and token
likewise from `--tenant`/`CELLAR_TENANT` and `--token`/`CELLAR_TOKEN`. `cellar status` also
shows the masters' roles: every live master etcd lists, or the master it was pointed at when
that one is a standby (then the leader's summary follows).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from cellar.errors import AlreadyExists, CellarError, NotFound
from cellar.proto.tiers import moves_text
from cellar.units import format_size, parse_duration_s

DEFAULT_MASTER = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 10.0
HTTP_PROBE_TIMEOUT_S = 2.0        # one master's /api/v1/status, for `cellar status`


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"cellar {prog}", description=description)
    parser.add_argument("--master", default=os.environ.get("CELLAR_MASTER", DEFAULT_MASTER),
                        help="master address HOST:PORT, or etcd://HOST:PORT[,...]/CLUSTER for a "
                             f"highly available cluster (default: $CELLAR_MASTER or {DEFAULT_MASTER})")
    parser.add_argument("--tenant", default=os.environ.get("CELLAR_TENANT", "default"),
                        help="tenant (default: $CELLAR_TENANT or 'default')")
    parser.add_argument("--token", default=os.environ.get("CELLAR_TOKEN"),
                        help="credential when the master checks one (default: $CELLAR_TOKEN)")
    parser.add_argument("--timeout", default=f"{DEFAULT_TIMEOUT_S:g}s", type=parse_duration_s,
                        help=f"give up after this long (default: {DEFAULT_TIMEOUT_S:g}s)")
    return parser


def _connect(args: argparse.Namespace) -> Any:
    from cellar.client import connect

    return connect(args.master, tenant=args.tenant, token=args.token, timeout_s=args.timeout)


def _run(prog: str, body: Callable[[], int]) -> int:
    """Run a command body; turn every expected failure into one line on stderr."""
    try:
        return body()
    except NotFound as exc:
        print(f"cellar {prog}: {exc}", file=sys.stderr)
    except CellarError as exc:
        print(f"cellar {prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
    except OSError as exc:
        name = f" {exc.filename}" if exc.filename else ""
        print(f"cellar {prog}:{name} {exc.strerror or exc}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


# ---- status -------------------------------------------------------------------------------

def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; numbers (and sizes) right-aligned."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_looks_numeric(r[i]) for r in cells[1:]) and len(cells) > 1
               for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _looks_numeric(text: str) -> bool:
    if ":" in text:
        return False  # an address (HOST:PORT) reads left to right
    return bool(text) and (text[0].isdigit() or text in ("-", "unlimited"))


def _pct(used: int, total: int) -> str:
    return f"{100.0 * used / total:.1f}%" if total else "-"


def _data_plane(endpoints: dict[str, str]) -> str:
    """The tcp address, plus the names of the other transports the node serves."""
    others = sorted(name for name in endpoints if name != "tcp")
    return endpoints.get("tcp", "-") + "".join(f" +{name}" for name in others)


def render_master_line(probed: dict[str, Any]) -> str:
    """One master's role, epoch and leader, as `cellar status` prints a master it was pointed
    at that does not serve (a standby)."""
    return (f"master {probed['address']}: role {probed['role'] or '-'}  epoch {probed['epoch']}"
            f"  leader {probed['leader_address'] or '?'}")


def render_masters(cluster: str, masters: Sequence[dict[str, Any]]) -> str:
    """The live masters an etcd cluster lists, with their roles (from their HTTP status)."""
    if not masters:
        return f"no masters registered in etcd for cluster {cluster!r}"
    rows = []
    for m in masters:
        lease = m.get("lease_remaining_s")
        takeover = m.get("takeover") or {}
        rows.append([
            m["master_id"], m["address"], m["http"] or "-", m["role"], m["epoch"],
            f"{lease:.1f}s" if isinstance(lease, (int, float)) and m["role"] == "leader" else "-",
            (f"{takeover['duration_s']:.2f}s, {takeover['recovered_objects']} objects"
             + ("" if takeover.get("complete", True) else " (running)"))
            if takeover.get("duration_s") is not None and m["role"] == "leader" else "-",
        ])
    return format_table(["MASTER", "ADDRESS", "HTTP", "ROLE", "EPOCH", "LEASE", "TAKEOVER"], rows)


def render_status(address: str, status: dict[str, Any]) -> str:
    role = status["role"] or "-"
    leader = status.get("leader_address") or ""
    if not leader and role == "leader":
        leader = address
    lines = [
        f"Cellar master {address}  role {role}  epoch {status['epoch']}"
        + (f"  leader {leader}" if leader else ""),
        f"capacity {format_size(status['capacity_bytes'])}  used "
        f"{format_size(status['used_bytes'])} ({_pct(status['used_bytes'], status['capacity_bytes'])})"
        f"  objects {status['object_count']}  max object "
        f"{format_size(status['max_object_bytes'])}",
        "",
    ]
    tiers = status.get("tiers") or {}
    if set(tiers) - {"dram"}:  # DRAM and disk apart (docs/disk-tier.md)
        lines.append(format_table(
            ["TIER", "SEGMENTS", "CAPACITY", "USED", "USE", "OBJECTS", "HITS", "READ", "WRITTEN"], [
                [name, t["segments"], format_size(t["capacity_bytes"]),
                 format_size(t["used_bytes"]), _pct(t["used_bytes"], t["capacity_bytes"]),
                 t["objects"], t["hits"], format_size(t["read_bytes"]),
                 format_size(t["write_bytes"])]
                for name, t in tiers.items()]))
        if "disk" in tiers:
            lines.append(moves_text(tiers["disk"]))
        lines.append("")
    nodes = status["nodes"]
    if nodes:
        rows = [[n["node_id"], n["state"], n["segments"], format_size(n["capacity_bytes"]),
                 format_size(n["used_bytes"]), _pct(n["used_bytes"], n["capacity_bytes"]),
                 n["object_count"], _data_plane(n["endpoints"])] for n in nodes]
        lines.append(format_table(
            ["NODE", "STATE", "SEGMENTS", "CAPACITY", "USED", "USE", "OBJECTS", "DATA PLANE"], rows))
    else:
        lines.append("no storage nodes mounted")
    lines.append("")
    tenants = status["tenants"]
    if tenants:
        rows = [[t["name"], format_size(t["used_bytes"]), format_size(t["quarantined_bytes"]),
                 format_size(t["quota_bytes"]) if t["quota_bytes"] else "unlimited",
                 t["object_count"], t["quota_objects"] or "unlimited"] for t in tenants]
        # HELD: refused or revoked puts' ranges awaiting their grants' expiry, on the quota too
        lines.append(format_table(["TENANT", "USED", "HELD", "QUOTA", "OBJECTS", "MAX OBJECTS"],
                                  rows))
    else:
        lines.append("no tenants")
    return "\n".join(lines)


def fetch_http_status(http: str, timeout_s: float) -> dict[str, Any] | None:
    """A master's `/api/v1/status` JSON, or None when it did not answer."""
    import urllib.error

    from cellar.http_fetch import fetch_json

    if not http:
        return None
    try:
        body = fetch_json(http, "/api/v1/status", timeout_s=timeout_s)  # http_fetch's bound
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return body if isinstance(body, dict) else None


def etcd_masters(url: str, timeout_s: float) -> tuple[str, list[dict[str, Any]]]:
    """(the leader's address or "", every live master etcd lists) for an etcd:// address; each
    master's role, epoch and lease from its HTTP status, else from etcd's records."""
    from cellar.coord.discovery import LeaderDiscovery
    from cellar.coord.target import parse_etcd_url

    discovery = LeaderDiscovery(parse_etcd_url(url))
    try:
        leader = discovery.leader(timeout_s)
        records = discovery.masters(timeout_s)
    finally:
        discovery.close()
    masters = []
    for record in records:
        is_leader = leader is not None and record.master_id == leader.master_id
        entry: dict[str, Any] = {
            "master_id": record.master_id, "address": record.address, "http": record.http,
            "role": "leader" if is_leader else "standby",
            "epoch": leader.epoch if is_leader and leader is not None else record.epoch,
            "lease_remaining_s": None, "takeover": None, "reachable": False,
        }
        http = fetch_http_status(record.http, min(timeout_s, HTTP_PROBE_TIMEOUT_S))
        if http is not None:
            entry["reachable"] = True
            for key in ("role", "epoch", "lease_remaining_s", "takeover"):
                if key in http:
                    entry[key] = http[key]
        masters.append(entry)
    return (leader.address if leader is not None else ""), masters


def status_main(argv: list[str]) -> int:
    parser = _parser("status", "Print the masters' roles and the cluster's capacity, use, nodes, "
                               "objects and tenants.")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)

    def body() -> int:
        from cellar.client.probe import probe_master
        from cellar.client.sync import parse_master_address

        target = parse_master_address(args.master)
        out: dict[str, Any] = {}
        text: list[str] = []
        if target is not None:
            leader, masters = etcd_masters(args.master, args.timeout)
            out["masters"] = masters
            text += [f"etcd {','.join(target.endpoints)} cluster {target.cluster}: leader "
                     f"{leader or 'none (election under way)'}", render_masters(target.cluster, masters), ""]
        else:
            probed = probe_master(args.master, tenant=args.tenant, token=args.token,
                                  timeout_s=args.timeout)
            if probed["role"] != "standby":
                out.update(probed)
                _print_status(args, out, text + [render_status(args.master, probed)])
                return 0
            out["probed"] = {"address": args.master, "role": probed["role"],
                             "epoch": probed["epoch"], "leader_address": probed["leader_address"]}
            text += [render_master_line({**probed, "address": args.master}), ""]
        try:
            with _connect(args) as client:
                status = client.status()
                where = client.master_address
        except CellarError as exc:
            _print_status(args, out, text)
            print(f"cellar status: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        out.update(status)
        _print_status(args, out, text + [render_status(where, status)])
        return 0

    return _run("status", body)


def _print_status(args: argparse.Namespace, out: dict[str, Any], text: list[str]) -> None:
    if args.json:
        import json

        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print("\n".join(text))


# ---- put / get / rm -----------------------------------------------------------------------

def put_main(argv: list[str]) -> int:
    parser = _parser("put", "Store a file's bytes (or stdin's, with FILE '-') under KEY.")
    parser.add_argument("key")
    parser.add_argument("file", help="path, or - for stdin")
    parser.add_argument("--replicas", type=int, default=1, help="copies on distinct nodes (default 1)")
    parser.add_argument("--upsert", action="store_true", help="replace an existing value")
    args = parser.parse_args(argv)

    def body() -> int:
        if args.file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as f:
                data = f.read()
        with _connect(args) as client:
            try:
                if args.upsert:
                    client.upsert(args.key, data, replicas=args.replicas)
                else:
                    client.put(args.key, data, replicas=args.replicas)
            except AlreadyExists:
                print(f"cellar put: {args.key!r} already exists (--upsert replaces it)",
                      file=sys.stderr)
                return 1
        print(f"stored {args.key!r}: {len(data)} bytes, {args.replicas} replica(s)",
              file=sys.stderr)
        return 0

    return _run("put", body)


def get_main(argv: list[str]) -> int:
    parser = _parser("get", "Write KEY's bytes to FILE, or to stdout without FILE.")
    parser.add_argument("key")
    parser.add_argument("file", nargs="?", help="output path (default: stdout)")
    args = parser.parse_args(argv)

    def body() -> int:
        with _connect(args) as client:
            try:
                data = client.get(args.key)
            except NotFound:
                print(f"cellar get: {args.key!r} not found (tenant {args.tenant!r})",
                      file=sys.stderr)
                return 1
        if args.file is None or args.file == "-":
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except BrokenPipeError:
                pass
        else:
            with open(args.file, "wb") as f:
                f.write(data)
        return 0

    return _run("get", body)


def rm_main(argv: list[str]) -> int:
    parser = _parser("rm", "Remove KEY (or, with --prefix, every key starting with KEY).")
    parser.add_argument("key")
    parser.add_argument("--prefix", action="store_true", help="remove every key with this prefix")
    args = parser.parse_args(argv)

    def body() -> int:
        with _connect(args) as client:
            if args.prefix:
                print(f"removed {client.remove_prefix(args.key)} key(s)", file=sys.stderr)
                return 0
            if client.remove(args.key):
                print(f"removed {args.key!r}", file=sys.stderr)
                return 0
        print(f"cellar rm: not found: {args.key!r}", file=sys.stderr)
        return 1

    return _run("rm", body)
