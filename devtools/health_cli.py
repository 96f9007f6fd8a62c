"""`cellar health [URL]`: exit 0 when a master's or storage node's /health answers 2xx.

The image's Docker HEALTHCHECK. URL defaults to `$CELLAR_HEALTH_URL`. The probe runs in the
server's own container, so it reads the server's own setting: when that process serves its
HTTP port over TLS (`$CELLAR_MASTER_HTTP_TLS` or `$CELLAR_NODE_HTTP_TLS` true, as
`deploy/compose/compose.tls.yaml` sets), an `http://` URL is asked over `https://`, verified
against `$CELLAR_TLS_CA` (cellar.http_fetch: never plaintext to a TLS port, never unverified).
Exit 1 with the reason on stderr otherwise (refused, timed out, not 2xx, bad certificate).
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse

from cellar.config import parse_bool
from cellar.http_fetch import HTTPS, fetch

DEFAULT_TIMEOUT_S = 2.0
TLS_SETTINGS = ("CELLAR_MASTER_HTTP_TLS", "CELLAR_NODE_HTTP_TLS")


def serves_tls(env: dict[str, str]) -> bool:
    """Whether this container's server serves its HTTP port over TLS (its own env setting, read
    as the server reads it; a value the server would refuse counts as no)."""
    for name in TLS_SETTINGS:
        try:
            if parse_bool(env.get(name, "").strip()):
                return True
        except ValueError:
            pass
    return False


def probe_address(url: str, env: dict[str, str]) -> tuple[str, str]:
    """(HTTP address for cellar.http_fetch, path) of `url`, upgraded to https when `env` says
    the server serves TLS."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https" or serves_tls(env)
    return (HTTPS if tls else "http://") + parts.netloc, parts.path or "/health"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cellar health", description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", default=os.environ.get("CELLAR_HEALTH_URL", ""),
                        help="the /health URL (default: $CELLAR_HEALTH_URL)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds to wait for the answer (default: {DEFAULT_TIMEOUT_S:g})")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.url:
        print("cellar health: no URL (give one or set CELLAR_HEALTH_URL)", file=sys.stderr)
        return 2
    try:
        address, path = probe_address(args.url, dict(os.environ))
        fetch(address, path, timeout_s=args.timeout)
    except Exception as exc:  # noqa: BLE001 - any failure is "unhealthy", said once
        print(f"cellar health: {args.url}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
