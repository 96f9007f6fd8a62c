"""Client-side credentials: which bearer token a client sends to a master when given none.

`cellar up` writes the tokens it creates so that `cellar.connect('127.0.0.1:50051')` and every
CLI command work without a flag. This module only reads those files; the master's token store
(hashed tokens) is `cellar.master.serving.auth`, and nothing here ever logs or prints a token.

Resolution, for a client that was given no `token=` (first hit wins):
1. the environment variable `CELLAR_TOKEN` (`CELLAR_ADMIN_TOKEN` for admin commands);
2. the credentials file of that address: `~/.cellar/credentials/<host>_<port>.json`
   (the directory can be moved with `CELLAR_CREDENTIALS_DIR`; `cellar up` also writes a copy
   into its run directory: `<run_dir>/credentials/`);
3. none: the master refuses the call with `cellar.Unauthenticated`.

File layout (JSON object, mode 0600, directory 0700; one file per master address):
    {"address": "127.0.0.1:50051",           # the gRPC address it was written for
     "tenant": "default",                    # tenant of "token"
     "token": "cellar_<id>_<secret>",        # the default tenant's token
     "admin_token": "cellar_<id>_<secret>",  # optional: the cluster's admin token
     "http": ["127.0.0.1:9400"],             # optional: the masters' HTTP (admin API) addresses
     "tls_ca": "/path/ca.pem",               # optional: the master speaks TLS; verify with this
     "run_dir": "/path/of/the/run/dir"}      # optional: informational
For an HA cluster (`etcd://...` address) the file is named after the etcd address the same
way (`etcd_<host>_<port>.json` of the first endpoint) and written by `cellar up --ha`.
A file that is not private to its owner (group/other bits set) is ignored, like ssh does.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV_TOKEN = "CELLAR_TOKEN"
ENV_ADMIN_TOKEN = "CELLAR_ADMIN_TOKEN"
ENV_CREDENTIALS_DIR = "CELLAR_CREDENTIALS_DIR"
ENV_TLS_CA = "CELLAR_TLS_CA"
DEFAULT_CREDENTIALS_DIR = Path("~/.cellar/credentials")
MAX_CREDENTIALS_FILE_BYTES = 64 * 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


def credentials_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where per-address credentials files live (`CELLAR_CREDENTIALS_DIR` or ~/.cellar/credentials)."""
    env = os.environ if environ is None else environ
    return Path(env.get(ENV_CREDENTIALS_DIR) or DEFAULT_CREDENTIALS_DIR).expanduser()


def file_name(address: str) -> str:
    """`127.0.0.1:50051` -> `127.0.0.1_50051.json`; `etcd://h:2379,h2:2379/c` -> `etcd_h_2379.json`."""
    address = address.strip()
    prefix = ""
    if address.startswith("etcd://"):
        prefix = "etcd_"
        address = address[len("etcd://"):].split("/", 1)[0].split(",", 1)[0]
    if address.startswith("localhost:"):  # the same master as 127.0.0.1
        address = "127.0.0.1:" + address.split(":", 1)[1]
    return prefix + _UNSAFE.sub("_", address).strip("_") + ".json"


def credentials_path(address: str, environ: Mapping[str, str] | None = None) -> Path:
    return credentials_dir(environ) / file_name(address)


def read_credentials(address: str, environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The parsed credentials file of `address`, or None (absent, unreadable, not private)."""
    return read_private_json(credentials_path(address, environ))


def read_private_json(path: Path) -> dict[str, Any] | None:
    """A credentials file's JSON object, or None (absent, unreadable, not private, too large)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid != os.getuid():
            return None
        data = os.read(fd, MAX_CREDENTIALS_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CREDENTIALS_FILE_BYTES:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _lookup(address: str, variable: str, entry: str, environ: Mapping[str, str] | None) -> str | None:
    """$`variable` if set, else the string `entry` of the address's credentials file, else None."""
    env = os.environ if environ is None else environ
    if env.get(variable, "").strip():  # a value pasted with its newline still works
        return env[variable].strip()
    creds = read_credentials(address, env)
    value = creds.get(entry) if creds else None
    return value.strip() if isinstance(value, str) and value.strip() else None


def default_token(address: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The token a client of `address` sends when given none: $CELLAR_TOKEN, else the token in
    the address's credentials file, else None."""
    return _lookup(address, ENV_TOKEN, "token", environ)


def default_admin_token(address: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The token admin commands send when given none: $CELLAR_ADMIN_TOKEN, else the file's
    "admin_token", else $CELLAR_TOKEN (an admin may keep its token there), else None."""
    env = os.environ if environ is None else environ
    return _lookup(address, ENV_ADMIN_TOKEN, "admin_token", env) or env.get(ENV_TOKEN) or None


def default_tls_ca(address: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The CA file a client or node verifies the master at `address` with: $CELLAR_TLS_CA,
    else the "tls_ca" of the address's credentials file, else None (plaintext)."""
    return _lookup(address, ENV_TLS_CA, "tls_ca", environ)


MAX_CREDENTIALS_FILES_LISTED = 256  # `credentials_files` names at most this many


def credentials_files(environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every readable private credentials file of the directory (at most
    MAX_CREDENTIALS_FILES_LISTED, in name order), parsed."""
    try:
        paths = sorted(credentials_dir(environ).glob("*.json"))[:MAX_CREDENTIALS_FILES_LISTED]
    except OSError:
        return []
    return [creds for path in paths if (creds := read_private_json(path)) is not None]


def write_private_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` with mode 0600 (directory 0700), atomically (rename)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_private_json(path: Path, value: dict[str, Any]) -> None:
    """Write `value` as JSON to `path` with mode 0600 (directory 0700), atomically."""
    write_private_bytes(path, (json.dumps(value, indent=1) + "\n").encode())


def write_credentials(address: str, value: dict[str, Any], environ: Mapping[str, str] | None = None) -> Path:
    """Write the credentials file of `address` (used by `cellar up`); returns its path."""
    path = credentials_path(address, environ)
    write_private_json(path, {"address": address, **value})
    return path


def remove_credentials(address: str, environ: Mapping[str, str] | None = None) -> None:
    """Remove the credentials file of `address` if present (a stopped `cellar up`)."""
    try:
        credentials_path(address, environ).unlink()
    except FileNotFoundError:
        pass
