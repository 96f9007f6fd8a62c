"""The cluster secret: the key the master signs grants with and storage nodes verify them with.

Resolution order (the same in every process, so a master and the nodes on one machine agree
without any setup):
1. the environment variable `CELLAR_CLUSTER_SECRET` (hex, at least 32 hex digits) if set;
2. else the file named by the process's `cluster_secret_file` setting (hex text);
3. else `~/.cellar/cluster-secret`, created with 32 random bytes (hex) and mode 0600 if missing.

Creating the default file is race-free: the secret is written to a private temporary file and
hard-linked into place, so two processes starting together both end up reading the same value.
This module never logs or prints a secret.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from cellar.errors import ConfigError

ENV_SECRET = "CELLAR_CLUSTER_SECRET"
DEFAULT_SECRET_PATH = Path("~/.cellar/cluster-secret")
SECRET_BYTES = 32
MIN_SECRET_HEX_CHARS = 32
_READ_RETRIES = 50


def _decode(text: str, origin: str, field: str) -> bytes:
    text = text.strip()
    if len(text) < MIN_SECRET_HEX_CHARS:
        raise ConfigError(field, f"{origin}: secret must be at least {MIN_SECRET_HEX_CHARS} hex digits")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ConfigError(field, f"{origin}: secret is not a hex string") from None


def _read_file(path: Path, field: str) -> bytes:
    # A concurrent creator links the file only once it is complete, but retry briefly anyway
    # in case a human is writing it by hand.
    last_error = ""
    for _ in range(_READ_RETRIES):
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(field, f"cannot read {path}: {exc.strerror}") from None
        try:
            return _decode(text, str(path), field)
        except ConfigError as exc:
            last_error = str(exc)
        time.sleep(0.01)
    raise ConfigError(field, last_error.partition(": ")[2] or f"{path}: unreadable secret")


def _create_default(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_hex(SECRET_BYTES) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # atomic: fails if another process created it first
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def load_cluster_secret(path: str | None, *, environ: dict[str, str] | None = None) -> bytes:
    """Return the cluster secret (see the module docstring for where it comes from)."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_SECRET)
    if value is not None:
        return _decode(value, f"environment variable {ENV_SECRET}", ENV_SECRET)
    if path:
        return _read_file(Path(path).expanduser(), "cluster_secret_file")
    default = DEFAULT_SECRET_PATH.expanduser()
    if not default.exists():
        try:
            _create_default(default)
        except OSError as exc:
            raise ConfigError("cluster_secret_file", f"cannot create {default}: {exc.strerror}") from None
    return _read_file(default, "cluster_secret_file")
