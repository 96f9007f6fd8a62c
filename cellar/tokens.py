"""The token store: bearer tokens of tenants and admins, kept hashed in one private file.

What a token is
    `cellar_<id>_<secret>`: `id` is 12 hex digits that name the token in `cellar token list`
    and `revoke` (public, not a secret); `secret` is 32 random bytes, base64url. The store keeps
    only SHA-256 of the whole token: tokens are random, so a fast hash is enough (no password
    stretching), and a leaked store file lets nobody in.

What a record says
    kind `tenant` (acts as exactly one tenant) or `admin` (tenant and quota changes, token
    management, and may act as any tenant); `shm` (the holder is trusted on the nodes' hosts:
    it may map whole segment files, see docs/security.md); a free-form label; creation time.

The file
    JSON `{"version": 1, "tokens": [{"id", "kind", "tenant", "sha256", "shm", "label",
    "created_ms"}, ...]}`, mode 0600, replaced atomically. `cellar up` and `cellar token create
    --store FILE` write it before a master starts; a running master writes it for
    `POST /api/v1/tokens` and `POST /api/v1/tokens/revoke`, and re-reads it when its mtime
    changes (`refresh`), so a second master sharing the file sees a revocation within a tick.

The shared layer (HA)
    Masters elected through etcd keep what the admin API creates and revokes in etcd instead
    (cellar.master.serving.token_log), so every later leader knows it whatever file it was
    given (a read-only Kubernetes Secret, another host's): `set_shared` lays those records and
    revoked ids over the file's. A shared record is used like a file one; a revoked id is
    refused whichever layer holds it. The file stays the bootstrap (the first admin token).

Invariant: a token string is held only long enough to hash it; nothing here logs, prints or
stores a plaintext token (only `create` returns one, once).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cellar.credentials import write_private_json
from cellar.errors import ConfigError

DEFAULT_TOKENS_PATH = "~/.cellar/tokens.json"  # a master's store when tokens_file is empty
TOKEN_PREFIX = "cellar_"
TOKEN_ID_HEX_CHARS = 12
TOKEN_SECRET_BYTES = 32
MAX_TOKEN_CHARS = 256          # longer tokens are refused before any hashing
MAX_TOKENS = 100_000           # records one store holds
MAX_STORE_FILE_BYTES = 64 << 20
KIND_TENANT = "tenant"
KIND_ADMIN = "admin"
KINDS = (KIND_TENANT, KIND_ADMIN)
_TOKEN = re.compile(r"^cellar_([0-9a-f]{12})_[A-Za-z0-9_-]{43}$")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_id_of(token: str) -> str | None:
    """The public id inside a well-formed token, else None."""
    if len(token) > MAX_TOKEN_CHARS:
        return None
    match = _TOKEN.match(token)
    return match.group(1) if match else None


def new_token() -> tuple[str, str]:
    """(id, token) of a fresh random token."""
    token_id = secrets.token_hex(TOKEN_ID_HEX_CHARS // 2)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(TOKEN_SECRET_BYTES)).decode().rstrip("=")
    return token_id, f"{TOKEN_PREFIX}{token_id}_{secret}"


@dataclass(frozen=True, slots=True)
class TokenRecord:
    id: str
    kind: str
    tenant: str          # the tenant a `tenant` token acts as ("" for admin)
    sha256: str
    shm: bool = False
    label: str = ""
    created_ms: int = 0

    def public(self) -> dict[str, Any]:
        """What `cellar token list` shows: everything but the hash."""
        return {"id": self.id, "kind": self.kind, "tenant": self.tenant, "shm": self.shm,
                "label": self.label, "created_ms": self.created_ms}


def parse_record(raw: Any, origin: str) -> TokenRecord:
    if not isinstance(raw, dict):
        raise ConfigError("tokens_file", f"{origin}: a token record must be an object")
    try:
        record = TokenRecord(str(raw["id"]), str(raw["kind"]), str(raw.get("tenant", "")),
                             str(raw["sha256"]), bool(raw.get("shm", False)),
                             str(raw.get("label", "")), int(raw.get("created_ms", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError("tokens_file", f"{origin}: bad token record ({exc})") from None
    if record.kind not in KINDS or not re.fullmatch(r"[0-9a-f]{12}", record.id):
        raise ConfigError("tokens_file", f"{origin}: bad token record {record.id!r}")
    if record.kind == KIND_TENANT and not record.tenant:
        raise ConfigError("tokens_file", f"{origin}: tenant token {record.id} names no tenant")
    return record


class TokenStore:
    """Token records by id, loaded from and saved to one file (or in memory when path is None)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path).expanduser() if path else None
        self._records: dict[str, TokenRecord] = {}
        # the shared layer (module docstring): records and revoked ids kept in etcd
        self._shared: dict[str, TokenRecord] = {}
        self._revoked: set[str] = set()
        self._mtime_ns = -1
        self.generation = 0  # grows on every change, so callers can drop cached lookups
        self.refresh()

    def __len__(self) -> int:
        return len(self.records())

    def set_shared(self, records: dict[str, TokenRecord], revoked: set[str]) -> None:
        """Lay `records` and `revoked` (the shared layer, read from etcd) over the file's."""
        self._shared, self._revoked = dict(records), set(revoked)
        self.generation += 1

    def add_shared(self, record: TokenRecord) -> None:
        self._shared[record.id] = record
        self.generation += 1

    def revoke_shared(self, token_id: str) -> None:
        self._revoked.add(token_id)
        self.generation += 1

    def known(self, token_id: str) -> bool:
        """Whether `token_id` names a token this store accepts (either layer, not revoked)."""
        return token_id not in self._revoked and (token_id in self._shared
                                                  or token_id in self._records)

    def refresh(self) -> bool:
        """Re-read the file if it changed since the last read; True if it did."""
        if self.path is None:
            return False
        try:
            mtime_ns = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime_ns = 0
        if mtime_ns == self._mtime_ns:
            return False
        self._mtime_ns = mtime_ns  # a bad file is read again only once it changes again
        self._records = self._load() if mtime_ns else {}
        self.generation += 1
        return True

    def _load(self) -> dict[str, TokenRecord]:
        assert self.path is not None
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise ConfigError("tokens_file", f"cannot read {self.path}: {exc.strerror}") from None
        if len(data) > MAX_STORE_FILE_BYTES:
            raise ConfigError("tokens_file", f"{self.path} is over {MAX_STORE_FILE_BYTES} bytes")
        try:
            raw = json.loads(data) if data.strip() else {"tokens": []}
        except ValueError as exc:
            raise ConfigError("tokens_file", f"{self.path}: not JSON ({exc})") from None
        items = raw.get("tokens") if isinstance(raw, dict) else None
        if not isinstance(items, list) or len(items) > MAX_TOKENS:
            raise ConfigError("tokens_file", f"{self.path}: expected {{\"tokens\": [...]}}")
        records = [parse_record(item, str(self.path)) for item in items]
        return {r.id: r for r in records}

    def _save(self) -> None:
        self.generation += 1
        if self.path is None:
            return
        write_private_json(self.path, {"version": 1, "tokens": [asdict(r) for r in self._records.values()]})
        self._mtime_ns = self.path.stat().st_mtime_ns

    def create(self, kind: str, tenant: str = "", *, shm: bool = False, label: str = "") -> tuple[TokenRecord, str]:
        """A new token, saved to the file: its record and the plaintext (returned only here,
        once)."""
        record, token = self.draft(kind, tenant, shm=shm, label=label)
        self._records[record.id] = record
        self._save()
        return record, token

    def draft(self, kind: str, tenant: str = "", *, shm: bool = False, label: str = "") -> tuple[TokenRecord, str]:
        """A new token's record and plaintext, kept nowhere yet (the shared layer's writer
        stores it, then `add_shared`)."""
        if kind not in KINDS:
            raise ValueError(f"token kind must be one of {KINDS}, not {kind!r}")
        if kind == KIND_TENANT and not tenant:
            raise ValueError("a tenant token needs a tenant")
        if len(self._records) + len(self._shared) + len(self._revoked) >= MAX_TOKENS:
            raise ValueError(f"the store already holds {MAX_TOKENS} tokens (max_tokens)")
        token_id, token = new_token()
        while token_id in self._records or token_id in self._shared or token_id in self._revoked:
            token_id, token = new_token()
        record = TokenRecord(token_id, kind, tenant if kind == KIND_TENANT else "", digest(token),
                             shm, label[:200], int(time.time() * 1000))
        return record, token

    def add(self, kind: str, token: str, tenant: str = "", *, shm: bool = False,
            label: str = "") -> TokenRecord:
        """Accept a token the caller already holds (a test session's, an operator's own); it
        must have the `cellar_<id>_<secret>` form. Only its hash is stored."""
        token_id = token_id_of(token)
        if token_id is None:
            raise ValueError("not a cellar token (cellar_<12 hex>_<43 base64url>)")
        if kind not in KINDS or (kind == KIND_TENANT and not tenant):
            raise ValueError(f"bad kind {kind!r} or missing tenant")
        record = TokenRecord(token_id, kind, tenant if kind == KIND_TENANT else "", digest(token),
                             shm, label[:200], int(time.time() * 1000))
        self._records[token_id] = record
        self._save()
        return record

    def revoke(self, token_id: str) -> bool:
        if self._records.pop(token_id, None) is None:
            return False
        self._save()
        return True

    def records(self) -> list[TokenRecord]:
        merged = {**self._records, **self._shared}
        return sorted((r for r in merged.values() if r.id not in self._revoked),
                      key=lambda r: (r.created_ms, r.id))

    def lookup(self, token: str) -> TokenRecord | None:
        """The record of `token` if it is one of this store's, compared in constant time."""
        token_id = token_id_of(token)
        if not token_id or token_id in self._revoked:
            return None
        record = self._shared.get(token_id) or self._records.get(token_id)
        if record is None or not hmac.compare_digest(record.sha256, digest(token)):
            return None
        return record


def ensure_private(path: Path) -> None:
    """Refuse a store file others can read or write (tokens are hashed, but who may add one?)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if mode & 0o022:
        raise ConfigError("tokens_file", f"{path} is writable by others (mode {mode & 0o777:o})")
