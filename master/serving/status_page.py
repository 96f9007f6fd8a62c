"""The master's `/` page: one self-contained HTML document an operator can leave open.

What it shows (the same view `cellar top` draws in a terminal): this master's role and epoch,
the leader, the cluster's capacity and use, with a disk tier each tier's use and traffic (hits,
bytes read and written) and the disk's moves, every storage node with its state and a use bar,
every tenant with a quota bar, and the master's recent events (master/serving/events.py).

Why it looks like this: it must work where the operator is (a port-forward, a browser with
scripts off, no internet), so there are no external assets, no script and no framework: inline
CSS, bars drawn with widths, and a `<meta http-equiv="refresh">` that reloads it. Every value
comes from `status_json`, the same snapshot `/api/v1/status` answers, so the page and the API
cannot disagree. Every string from outside (node ids, tenant names, event text) is escaped.
This module only renders; it reads no state of its own.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping
from typing import Any

from cellar.master.serving.events import Event
from cellar.proto.tiers import moves_text
from cellar.units import format_size

REFRESH_S = 5
MAX_EVENTS_SHOWN = 30

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2330;background:#f6f7f9}
h1{font-size:1.3em;margin:0 0 .2em} h2{font-size:1.05em;margin:1.4em 0 .4em}
.sub{color:#5a6270} table{border-collapse:collapse;background:#fff;min-width:40em}
th,td{text-align:left;padding:.3em .7em;border-bottom:1px solid #e3e6ea}
th{font-weight:600;color:#5a6270;font-size:.9em}
.bar{display:inline-block;width:14em;height:.8em;background:#e3e6ea;border-radius:3px;
vertical-align:middle;overflow:hidden}
.bar span{display:block;height:100%;background:#3b7dd8} .bar.hot span{background:#d8773b}
.bar.full span{background:#c9302c}
.state{font-weight:600} .ACTIVE{color:#2a8a3e} .SUSPECT{color:#c98a00} .EXPIRED{color:#c9302c}
.kind{font-family:monospace} .node_expired,.deposed{color:#c9302c}
.elected,.new_leader{color:#3b7dd8} .rebuild_done{color:#2a8a3e}
.cards{display:flex;gap:1em;flex-wrap:wrap} .card{background:#fff;padding:.6em 1em;
border:1px solid #e3e6ea;border-radius:4px} .card b{display:block;font-size:1.2em}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def use_fraction(used: int, capacity: int) -> float:
    """used/capacity in [0, 1]; 0 for an empty or unlimited capacity."""
    return 0.0 if capacity <= 0 else min(1.0, max(0.0, used / capacity))


def _bar(fraction: float, high: float) -> str:
    cls = "bar full" if fraction >= 0.999 else "bar hot" if fraction >= high else "bar"
    return (f'<span class="{cls}" role="meter" aria-valuenow="{fraction * 100:.1f}" '
            f'aria-valuemin="0" aria-valuemax="100"><span style="width:{fraction * 100:.1f}%">'
            f"</span></span> {fraction * 100:.1f}%")


def nodes_of(segments: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Segments (as `/api/v1/status` lists them) grouped by node: id, state, capacity, used,
    objects, segments; sorted by node id."""
    nodes: dict[str, dict[str, Any]] = {}
    for seg in segments:
        row = nodes.setdefault(seg["node"], {"node": seg["node"], "state": seg["state"],
                                             "capacity": 0, "used": 0, "objects": 0, "segments": 0})
        row["capacity"] += seg["capacity"]
        row["used"] += seg["used"]
        row["objects"] += seg["objects"]
        row["segments"] += 1
    return sorted(nodes.values(), key=lambda r: r["node"])


def _tiers_table(tiers: Mapping[str, Mapping[str, int]], high: float) -> list[str]:
    """DRAM and disk apart, when a node has a disk tier (docs/disk-tier.md); else nothing.
    Use and traffic per tier (cellar.proto.tiers.merge_tier_stats), then the disk's moves."""
    if set(tiers) <= {"dram"}:
        return []
    out = ["<h2>Tiers</h2><table id=tiers><thead><tr><th>tier</th><th>segments</th>"
           "<th>objects</th><th>used / capacity</th><th>use</th><th>hits</th><th>read</th>"
           "<th>written</th></tr></thead><tbody>"]
    for name, row in tiers.items():
        used, capacity = int(row["used_bytes"]), int(row["capacity_bytes"])
        out.append(f'<tr data-tier="{_e(name)}"><td>{_e(name)}</td><td>{int(row["segments"])}</td>'
                   f"<td>{int(row['objects'])}</td><td>{_e(format_size(used))} / "
                   f"{_e(format_size(capacity))}</td><td>{_bar(use_fraction(used, capacity), high)}"
                   f"</td><td>{int(row['hits'])}</td>"
                   f"<td>{_e(format_size(int(row['read_bytes'])))}</td>"
                   f"<td>{_e(format_size(int(row['write_bytes'])))}</td></tr>")
    out.append("</tbody></table>")
    disk = tiers.get("disk")
    if disk is not None:
        out.append(f"<div class=sub id=tier-moves>{_e(moves_text(disk))}</div>")
    return out


def _leader_text(status: Mapping[str, Any]) -> str:
    if status.get("role") == "single":
        return "this master (single, no etcd)"
    leader = status.get("leader")
    if not leader:
        return "none known"
    return f"{leader['master_id']} at {leader['address']} (epoch {leader['epoch']})"


def repair_line(repair: Mapping[str, Any]) -> str:
    """Re-replication and drain in one line (master/repair.py)."""
    draining = ", ".join(repair.get("draining") or []) or "none"
    return (f"re-replication: {repair.get('under_replicated', 0)} objects under-replicated, "
            f"{repair.get('copies_in_flight', 0)} copies in flight, {repair.get('copies_done', 0)} "
            f"done ({format_size(int(repair.get('bytes_copied', 0)))}), "
            f"{repair.get('copy_failures', 0)} failed; draining: {draining}")


def render(status: Mapping[str, Any], events: Iterable[Event], *, refresh_s: int = REFRESH_S) -> str:
    high = float(status.get("limits", {}).get("eviction_high_watermark", 0.9))
    capacity, used = int(status.get("capacity", 0)), int(status.get("used", 0))
    takeover = status.get("takeover")
    rebuild = "none"
    if takeover:
        rebuild = (f"done in {takeover['duration_s']:.3f} s, {takeover['recovered_objects']} objects"
                   if takeover["complete"] else "in progress")
    out = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="refresh" content="{int(refresh_s)}">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>cellar master {_e(status.get('role', ''))}</title><style>{_CSS}</style></head><body>",
        f"<h1>Cellar master <span id=role>{_e(status.get('role', ''))}</span>, epoch "
        f"<span id=epoch>{_e(status.get('epoch', 0))}</span></h1>",
        f"<div class=sub>master {_e(status.get('master_id') or '-')}; leader "
        f"<span id=leader>{_e(_leader_text(status))}</span>; last rebuild {_e(rebuild)}; "
        f"refreshes every {int(refresh_s)} s; {_e(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()))}</div>",
        "<h2>Cluster</h2><div class=cards>",
        f"<div class=card>capacity<b id=capacity>{_e(format_size(capacity))}</b></div>",
        f"<div class=card>used<b>{_e(format_size(used))}</b>{_bar(use_fraction(used, capacity), high)}</div>",
        f"<div class=card>objects<b id=objects>{_e(status.get('objects', 0))}</b></div>",
        f"<div class=card>writing<b>{_e(status.get('writing', 0))}</b></div>",
        f"<div class=card>pins<b>{_e(status.get('pins', 0))}</b></div></div>",
        f"<div class=sub id=repair>{_e(repair_line(status.get('repair') or {}))}</div>",
        *_tiers_table(status.get("tiers") or {}, high),
        "<h2>Storage nodes</h2><table id=nodes><thead><tr><th>node</th><th>state</th>"
        "<th>segments</th><th>objects</th><th>used / capacity</th><th>use</th></tr></thead><tbody>",
    ]
    nodes = status.get("nodes") or nodes_of(status.get("segments", []))
    for n in nodes:
        out.append(
            f'<tr data-node="{_e(n["node"])}" data-state="{_e(n["state"])}"><td>{_e(n["node"])}</td>'
            f'<td class="state {_e(n["state"])}">{_e(n["state"])}</td><td>{n["segments"]}</td>'
            f"<td>{n['objects']}</td><td>{_e(format_size(n['used']))} / {_e(format_size(n['capacity']))}</td>"
            f"<td>{_bar(use_fraction(n['used'], n['capacity']), high)}</td></tr>")
    if not nodes:
        out.append("<tr><td colspan=6>no storage node mounted</td></tr>")
    out.append("</tbody></table><h2>Tenants</h2><table id=tenants><thead><tr><th>tenant</th>"
               "<th>objects</th><th>used</th><th>held</th><th>byte quota</th><th>quota use</th>"
               "</tr></thead><tbody>")
    for t in status.get("tenants", []):
        quota = int(t["quota_bytes"])
        held = int(t.get("quarantined_bytes", 0))  # counted against the quota (master/quota.py)
        bar = _bar(use_fraction(int(t["used_bytes"]) + held, quota), high) if quota else "unlimited"
        objects = f"{t['objects']}" + (f" / {t['quota_objects']}" if t["quota_objects"] else "")
        out.append(
            f'<tr data-tenant="{_e(t["name"])}"><td>{_e(t["name"])}</td><td>{_e(objects)}</td>'
            f"<td>{_e(format_size(int(t['used_bytes'])))}</td><td>{_e(format_size(held))}</td>"
            f"<td>{_e(format_size(quota)) if quota else 'unlimited'}</td><td>{bar}</td></tr>")
    out.append("</tbody></table><h2>Recent events</h2><table id=events><thead><tr><th>time (UTC)</th>"
               "<th>kind</th><th>what</th></tr></thead><tbody>")
    shown = 0
    for ev in events:
        if shown >= MAX_EVENTS_SHOWN:
            break
        shown += 1
        out.append(f'<tr data-kind="{_e(ev.kind)}"><td>{_e(time.strftime("%H:%M:%S", time.gmtime(ev.time_s)))}</td>'
                   f'<td class="kind {_e(ev.kind)}">{_e(ev.kind)}</td><td>{_e(ev.message)}</td></tr>')
    if not shown:
        out.append("<tr><td colspan=3>nothing yet</td></tr>")
    out.append('</tbody></table><p class=sub>JSON: <a href="/api/v1/status">/api/v1/status</a>, '
               '<a href="/api/v1/events">/api/v1/events</a>; metrics: <a href="/metrics">/metrics</a></p>'
               "</body></html>\n")
    return "".join(out)
