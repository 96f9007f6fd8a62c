"""`cellar node drain NODE_ID`: take a storage node out without losing what it holds.

Asks the leading master's admin API (`POST /api/v1/nodes/drain`, an admin token: `--token`,
`$CELLAR_ADMIN_TOKEN` or the credentials file `cellar up` wrote) to drain the node: it takes no
new placements and the master has its objects copied to other nodes (node to node, paced by
the master's `repair_bytes_per_s`, replica counts and distinct nodes kept). The command then
polls the progress every `--interval`, printing each change ("N objects (SIZE) left"), and
exits 0 once the drain is done: the node can be stopped with nothing lost. A master that
forgot the drain (restarted, or a failover) is asked again. Exit 1 when the
master refuses (unknown node, not an admin) or `--timeout` passes first; 2 for bad usage.
The Helm chart runs it in the node pods' preStop hook (docs/deploy.md).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.parse
from typing import Any

from cellar.devtools.token_cli import TokenCommandError, admin_arguments, admin_call
from cellar.units import format_size, parse_duration_s

DEFAULT_TIMEOUT = "10m"
DEFAULT_INTERVAL = "1s"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cellar node drain", description=__doc__.split("\n\n")[0])
    parser.add_argument("node_id", help="the node to drain (its --node-id)")
    admin_arguments(parser)
    parser.add_argument("--timeout", default=DEFAULT_TIMEOUT, type=parse_duration_s,
                        help=f"give up after this long (default: {DEFAULT_TIMEOUT})")
    parser.add_argument("--interval", default=DEFAULT_INTERVAL, type=parse_duration_s,
                        help=f"progress poll period (default: {DEFAULT_INTERVAL})")
    return parser


def _line(status: dict[str, Any]) -> str:
    return (f"draining {status['node_id']}: {status['remaining_objects']} objects "
            f"({format_size(int(status['remaining_bytes']))}) left to copy")


def drain(args: argparse.Namespace) -> int:
    deadline = args.deadline = time.monotonic() + args.timeout
    status = _ask(args, "POST", "/api/v1/nodes/drain", {"node_id": args.node_id})
    last = ""
    query = "/api/v1/nodes/drain?" + urllib.parse.urlencode({"node_id": args.node_id})
    while not status.get("done"):
        line = _line(status)
        if line != last:
            print(line, flush=True)
            last = line
        if time.monotonic() >= deadline:
            print(f"cellar node drain: {args.node_id} not drained after {args.timeout:g}s",
                  file=sys.stderr)
            return 1
        time.sleep(args.interval)
        # a 404 now is a master that just started (the node has not mounted on it yet) or a
        # node that went away: asked again until `--timeout` either way
        status = _ask(args, "GET", query, until_mounted=True)
        if not status.get("draining"):
            # A drain is the leader's memory: a restarted master or a new leader does not
            # know of it. Asking again (idempotent) starts it there; the copies made so far
            # are on their nodes and count.
            print(f"the master does not know of the drain of {args.node_id} (it restarted, or "
                  "another master leads now): asking again", flush=True)
            status = _ask(args, "POST", "/api/v1/nodes/drain", {"node_id": args.node_id},
                          until_mounted=True)
    print(f"{args.node_id} drained: every object it holds has its replica count on other "
          "nodes; it can be stopped", flush=True)
    return 0


def _ask(args: argparse.Namespace, method: str, path: str, body: Any = None, *,
         until_mounted: bool = False) -> dict[str, Any]:
    """One admin call; while no master answers as the leader (a standby behind the Service, a
    master restarting), or with `until_mounted` while the node has not mounted on it yet (a
    master that just started), it is asked again every `--interval` until `--timeout`."""
    while True:
        try:
            answer = admin_call(args, method, path, body)
            break
        except TokenCommandError as exc:
            again = str(exc).startswith("no master answered") or (
                until_mounted and "is not mounted" in str(exc))
            if not again or time.monotonic() >= args.deadline:
                raise
            time.sleep(args.interval)
    if not isinstance(answer, dict) or "remaining_objects" not in answer:
        raise TokenCommandError(f"unexpected answer from the master: {answer!r}")
    return answer


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return drain(args)
    except TokenCommandError as exc:
        print(f"cellar node drain: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
