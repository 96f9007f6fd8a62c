"""The `cellar` command: one entry point, one subcommand per job.

Subcommands are imported lazily so that `cellar master` never loads client code and
`cellar get` never loads the master.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "master": ("cellar.master.main", "main", "run the metadata master"),
    "node": ("cellar.storage_node.main", "main", "run a storage node contributing a DRAM segment; `node drain ID` takes one out"),
    "up": ("cellar.devtools.up", "main", "start a local cluster (master + nodes) on 127.0.0.1"),
    "status": ("cellar.client.cli", "status_main", "print the cluster's capacity, nodes and tenants"),
    "top": ("cellar.client.top", "main", "live view of the cluster (the status page in the terminal)"),
    "put": ("cellar.client.cli", "put_main", "store a file's bytes under a key"),
    "get": ("cellar.client.cli", "get_main", "fetch a key's bytes to a file or stdout"),
    "rm": ("cellar.client.cli", "rm_main", "remove a key"),
    "token": ("cellar.devtools.token_cli", "main", "create, list or revoke the cluster's bearer tokens"),
    "tls": ("cellar.devtools.tls_cli", "main", "`tls create`: a private CA and a certificate for a cluster's names"),
    "health": ("cellar.devtools.health_cli", "main", "probe a master's or node's /health (the image's HEALTHCHECK)"),
    "bench": ("cellar.bench", "main", "run the data-plane and metadata benchmarks"),
    "soak": ("cellar.devtools.soak", "main", "random traffic under chaos (kills, stops, restarts); verify every read"),
}


def usage() -> str:
    lines = ["usage: cellar <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_text}" for name, (_m, _f, help_text) in SUBCOMMANDS.items()]
    lines += ["", "Run `cellar <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        from cellar import __version__

        print(f"cellar {__version__}")
        return 0
    entry = SUBCOMMANDS.get(argv[0])
    if entry is None:
        print(f"cellar: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = entry
    if argv[:2] == ["node", "drain"]:  # an admin command, not a node process
        module_name, func_name, argv = "cellar.devtools.drain_cli", "main", argv[1:]
    func = getattr(importlib.import_module(module_name), func_name)
    result = func(argv[1:])
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
