"""`cellar top`: the master's status page as a live terminal view.

It shows what the HTML page at the master's `/` shows (master/serving/status_page.py): role, epoch and
leader, capacity and use, with a disk tier each tier's use, hits and bytes read and written and
the disk's moves, nodes with state and use bars, tenants with quota bars and the recent
events, read from the master's `/api/v1/status` and `/api/v1/events` (so both views come from
one snapshot format). Pointed at a standby, it follows to the leader's HTTP address the
standby knows. It redraws in place every `--interval` (plain ANSI clear, no curses, so it also
works in a dumb terminal or a log); `--once` prints one frame and exits (scripts, tests).

Exit codes: 0, 1 when no master answered, 2 for bad usage. It only reads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
from typing import Any

from cellar.client.cli import format_table
from cellar.http_fetch import base_url, fetch_json
from cellar.proto.tiers import moves_text
from cellar.units import format_size, parse_duration_s

DEFAULT_HTTP = "127.0.0.1:9400"
HTTP_TIMEOUT_S = 2.0
BAR_CHARS = 20
MAX_EVENTS_SHOWN = 10
CLEAR = "\x1b[H\x1b[2J"


def bar(used: int, total: int, width: int = BAR_CHARS) -> str:
    """`[#####.....]  50.0%`; `-` when there is no total (unlimited)."""
    if total <= 0:
        return "-"
    fraction = min(1.0, max(0.0, used / total))
    filled = round(fraction * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {fraction * 100:5.1f}%"


def _get_json(http: str, path: str) -> Any:
    return fetch_json(http, path, timeout_s=HTTP_TIMEOUT_S)  # at most http_fetch.MAX_REPLY_BYTES


def fetch_view(http: str) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """(the HTTP address answered from, its status, its events); follows a standby once to the
    leader it names. Raises OSError / ValueError when the master does not answer."""
    status = _get_json(http, "/api/v1/status")
    leader = status.get("leader") or {}
    if status.get("role") == "standby" and leader.get("http") and leader["http"] != http:
        try:
            return fetch_view_of(leader["http"])
        except (OSError, ValueError):
            pass  # show the standby's own view: better than nothing
    return http, status, list(_get_json(http, "/api/v1/events"))


def fetch_view_of(http: str) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    return http, _get_json(http, "/api/v1/status"), list(_get_json(http, "/api/v1/events"))


def render(http: str, status: dict[str, Any], events: list[dict[str, Any]]) -> str:
    leader = status.get("leader")
    leader_text = ("this master (single)" if status.get("role") == "single"
                   else f"{leader['master_id']} at {leader['address']}" if leader else "none known")
    capacity, used = int(status.get("capacity", 0)), int(status.get("used", 0))
    lines = [
        f"cellar top  {http}  role {status.get('role', '-')}  epoch {status.get('epoch', 0)}  "
        f"leader {leader_text}  {time.strftime('%H:%M:%S')}",
        f"capacity {format_size(capacity)}  used {format_size(used)} {bar(used, capacity)}  "
        f"objects {status.get('objects', 0)}  writing {status.get('writing', 0)}  "
        f"pins {status.get('pins', 0)}",
        "",
    ]
    tiers = status.get("tiers") or {}
    if set(tiers) - {"dram"}:  # DRAM and disk apart (docs/disk-tier.md)
        lines.append(format_table(
            ["TIER", "SEGMENTS", "OBJECTS", "USED", "USE", "HITS", "READ", "WRITTEN"], [
                [name, t["segments"], t["objects"],
                 f"{format_size(t['used_bytes'])}/{format_size(t['capacity_bytes'])}",
                 bar(t["used_bytes"], t["capacity_bytes"]), t["hits"],
                 format_size(t["read_bytes"]), format_size(t["write_bytes"])]
                for name, t in tiers.items()]))
        if "disk" in tiers:
            lines.append(moves_text(tiers["disk"]))
        lines.append("")
    nodes = status.get("nodes", [])
    if nodes:
        lines.append(format_table(["NODE", "STATE", "SEGMENTS", "OBJECTS", "USED", "USE"], [
            [n["node"], n["state"], n["segments"], n["objects"],
             f"{format_size(n['used'])}/{format_size(n['capacity'])}", bar(n["used"], n["capacity"])]
            for n in nodes]))
    else:
        lines.append("no storage node mounted")
    lines.append("")
    # HELD: refused or revoked puts' ranges awaiting their grants' expiry, on the quota too
    lines.append(format_table(["TENANT", "OBJECTS", "USED", "HELD", "QUOTA", "QUOTA USE"], [
        [t["name"], t["objects"], format_size(t["used_bytes"]),
         format_size(t.get("quarantined_bytes", 0)),
         format_size(t["quota_bytes"]) if t["quota_bytes"] else "unlimited",
         bar(t["used_bytes"] + t.get("quarantined_bytes", 0), t["quota_bytes"])]
        for t in status.get("tenants", [])]))
    lines += ["", "recent events:"]
    for ev in events[:MAX_EVENTS_SHOWN]:
        stamp = time.strftime("%H:%M:%S", time.gmtime(float(ev.get("time", 0))))
        lines.append(f"  {stamp}Z  {ev.get('kind', ''):<13} {ev.get('message', '')}")
    if not events:
        lines.append("  nothing yet")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cellar top", description=(
        "Live view of a Cellar cluster (the master's status page in the terminal)."))
    parser.add_argument("--http", default=os.environ.get("CELLAR_STATUS_HTTP", DEFAULT_HTTP),
                        help=f"a master's HTTP address HOST:PORT, or https://HOST:PORT for a port "
                             f"with http_tls (verified against $CELLAR_TLS_CA or the credentials "
                             f"file naming that port) (default: "
                             f"$CELLAR_STATUS_HTTP or {DEFAULT_HTTP}); a standby is followed to "
                             f"its leader")
    parser.add_argument("--interval", default="2s", type=parse_duration_s,
                        help="redraw period (default 2s)")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.interval <= 0:
        parser.error("--interval must be > 0")
    try:
        while True:
            try:
                frame = render(*fetch_view(args.http))
            except (OSError, ValueError, urllib.error.URLError) as exc:
                if args.once:
                    print(f"cellar top: no answer from {base_url(args.http)}: {exc}",
                          file=sys.stderr)
                    return 1
                frame = f"cellar top: no answer from {base_url(args.http)}: {exc} (retrying)"
            if args.once:
                print(frame)
                return 0
            sys.stdout.write(CLEAR + frame + "\n")
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
