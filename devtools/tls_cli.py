"""`cellar tls create --dir DIR NAME...`: a private CA and one certificate for a cluster's names.

For a cluster whose operator has no CA of their own (compose, a trial): writes `ca.crt`,
`tls.crt` and `tls.key` into DIR, the file names of a Kubernetes `kubernetes.io/tls` Secret,
which `deploy/compose/compose.tls.yaml` mounts and the Helm chart's `tls.secretName` takes. The
certificate names every NAME given (host names, `*.domain` wildcards or IP addresses), and
127.0.0.1 and localhost unless `--no-loopback`, so a process's own health probe verifies it.
The CA's key is thrown away: a new name means a new CA (run it again, restart every process).
`tls.key` is written 0600; pass `--readable-key` when the containers' non-root user must read
a bind-mounted file (compose secrets are mounted as the file is).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cellar.tls import make_dev_pki

DEFAULT_DAYS = 365
KEY_MODE_READABLE = 0o644
OUTPUTS = {"ca.crt": "ca_file", "tls.crt": "cert_file", "tls.key": "key_file"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cellar tls create",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", metavar="NAME",
                        help="a name the certificate covers (host, *.domain or IP address)")
    parser.add_argument("--dir", required=True, type=Path,
                        help="folder for ca.crt, tls.crt and tls.key (made if missing)")
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS,
                        help=f"validity of the CA and the certificate, days (default: {DEFAULT_DAYS})")
    parser.add_argument("--no-loopback", action="store_true",
                        help="do not add 127.0.0.1 and localhost to the names")
    parser.add_argument("--readable-key", action="store_true",
                        help=f"write tls.key mode {KEY_MODE_READABLE:o}, not 600 (a bind-mounted "
                        "secret read by a container's non-root user)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["create"]:
        print("usage: cellar tls create --dir DIR NAME... (see cellar tls create --help)",
              file=sys.stderr)
        return 2
    args = _parser().parse_args(argv[1:])
    if args.days < 1:
        print("cellar tls create: --days must be at least 1", file=sys.stderr)
        return 2
    if any(name.strip() != name or not name for name in args.names):
        print("cellar tls create: a NAME may not be empty or carry spaces", file=sys.stderr)
        return 2
    made = make_dev_pki(args.dir / ".made", args.names, loopback=not args.no_loopback,
                        days=args.days)
    for out, field in OUTPUTS.items():
        target = args.dir / out
        target.write_bytes(getattr(made, field).read_bytes())
        target.chmod(KEY_MODE_READABLE if out != "tls.key" or args.readable_key else 0o600)
    for leftover in sorted((args.dir / ".made").iterdir()):
        leftover.unlink()
    (args.dir / ".made").rmdir()
    names = [*args.names, *(() if args.no_loopback else ("127.0.0.1", "localhost"))]
    print(f"wrote {args.dir}/ca.crt, tls.crt, tls.key for {', '.join(names)} "
          f"(valid {args.days} days; the CA key was not kept)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
