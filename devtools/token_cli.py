"""`cellar token create|list|revoke`: manage the bearer tokens of a cluster.

Through a running master's admin API (`/api/v1/tokens`, needs an admin token), or, with
`--store FILE`, directly in a token store file (bootstrap: the first admin token, before any
master runs; a running master sharing that file picks the change up on its next tick).

Where things come from when not given (cellar.credentials): the master's HTTP address from the
credentials file `cellar up` wrote for `--master` (default 127.0.0.1:50051), else `--http`;
the admin token from `--token`, `$CELLAR_ADMIN_TOKEN` or that file. `create` prints the new
token once, on stdout alone (so `TOKEN=$(cellar token create --tenant t)` works); nothing else
ever prints a token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
from typing import Any

from cellar.credentials import default_admin_token, default_tls_ca, read_credentials
from cellar.http_fetch import fetch_json
from cellar.tokens import KIND_ADMIN, KIND_TENANT, TokenStore

HTTP_TIMEOUT_S = 10.0


class TokenCommandError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cellar token", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    common = admin_arguments(argparse.ArgumentParser(add_help=False))
    common.add_argument("--store", default="", help="edit this token store file directly "
                        "instead of asking a master")
    create = sub.add_parser("create", parents=[common], help="create a token; prints it once")
    who = create.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", help="a token acting as this tenant")
    who.add_argument("--admin", action="store_true", help="an admin token")
    create.add_argument("--shm", action="store_true",
                        help="trusted on the nodes' hosts: may use shared memory (maps whole segments)")
    create.add_argument("--label", default="", help="a note shown by `list`")
    sub.add_parser("list", parents=[common], help="list tokens (ids, kinds, tenants; never a token)")
    revoke = sub.add_parser("revoke", parents=[common], help="revoke a token by its id")
    revoke.add_argument("id", help="the token id (12 hex digits, from `list` or `create`)")
    return parser


def admin_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--master, --http and --token: how an admin command finds a master and proves itself."""
    parser.add_argument("--master", default=os.environ.get("CELLAR_MASTER", "127.0.0.1:50051"),
                        help="the cluster's gRPC address (names its credentials file)")
    parser.add_argument("--http", default="", help="the masters' HTTP address(es) HOST:PORT "
                        "(https://HOST:PORT for a port with http_tls, verified against "
                        "$CELLAR_TLS_CA or the credentials' CA), comma-separated (default: from "
                        "the credentials file of --master)")
    parser.add_argument("--token", default=None, help="admin token (default: $CELLAR_ADMIN_TOKEN "
                        "or the credentials file)")
    return parser


def _http_addresses(args: argparse.Namespace) -> list[str]:
    if args.http:
        return [a for a in args.http.split(",") if a]
    creds = read_credentials(args.master) or {}
    found = creds.get("http") or []
    if isinstance(found, str):
        found = [found]
    if not found:
        raise TokenCommandError(f"no HTTP address for {args.master}: pass --http HOST:PORT "
                                "(or --store FILE)")
    return [str(a) for a in found]


def admin_call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    token = args.token if args.token is not None else default_admin_token(args.master)
    if not token:
        raise TokenCommandError("no admin token: pass --token or set CELLAR_ADMIN_TOKEN")
    last = ""
    for http in _http_addresses(args):
        try:
            return fetch_json(http, path, method=method, timeout_s=HTTP_TIMEOUT_S,
                              data=None if body is None else json.dumps(body).encode(),
                              ca_file=default_tls_ca(args.master), headers={
                                  "Authorization": f"Bearer {token}",
                                  "Content-Type": "application/json"})
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("error", "")
            except ValueError:
                detail = ""
            if exc.code == 503:  # a standby: the next address may be the leader
                last = f"{http}: {detail}"
                continue
            raise TokenCommandError(f"master {http} refused ({exc.code}): {detail}") from None
        except OSError as exc:
            last = f"{http}: {exc}"
    raise TokenCommandError(f"no master answered ({last})")


def _create(args: argparse.Namespace) -> dict[str, Any]:
    kind = KIND_ADMIN if args.admin else KIND_TENANT
    if args.store:
        store = TokenStore(args.store)
        record, token = store.create(kind, args.tenant or "", shm=args.shm, label=args.label)
        return {**record.public(), "token": token}
    made: dict[str, Any] = admin_call(args, "POST", "/api/v1/tokens", {
        "kind": kind, "tenant": args.tenant or "", "shm": args.shm, "label": args.label})
    return made


def _list(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.store:
        return [r.public() for r in TokenStore(args.store).records()]
    listed: list[dict[str, Any]] = admin_call(args, "GET", "/api/v1/tokens")
    return listed


def _revoke(args: argparse.Namespace) -> None:
    if args.store:
        if not TokenStore(args.store).revoke(args.id):
            raise TokenCommandError(f"no token {args.id!r} in {args.store}")
        return
    admin_call(args, "POST", "/api/v1/tokens/revoke", {"id": args.id})


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "create":
            made = _create(args)
            print(made["token"])
            print(f"created {made['kind']} token {made['id']}"
                  + (f" for tenant {made['tenant']!r}" if made["tenant"] else "")
                  + (" (shm allowed)" if made["shm"] else ""), file=sys.stderr)
            if made.get("tenant_known") is False:
                print(f"note: the master knows no tenant {made['tenant']!r} yet; create it "
                      "(PUT /api/v1/tenants) before the token can store anything", file=sys.stderr)
        elif args.action == "list":
            rows = _list(args)
            print(f"{'id':<12}  {'kind':<6}  {'tenant':<20}  shm  label")
            for r in rows:
                print(f"{r['id']:<12}  {r['kind']:<6}  {r['tenant'] or '-':<20}  "
                      f"{'yes' if r['shm'] else 'no ':<3}  {r['label']}")
        else:
            _revoke(args)
            print(f"revoked {args.id}", file=sys.stderr)
    except (TokenCommandError, ValueError) as exc:
        print(f"cellar token: {exc}", file=sys.stderr)
        return 1
    return 0
