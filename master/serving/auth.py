"""Who is calling, and may they: the one place the master says no (gRPC, fast line, HTTP).

Three identities (docs/security.md):
- tenant: a `cellar_...` token of kind tenant (cellar.tokens). Acts as exactly its
  tenant: the master takes the tenant from the token, a request that claims another one is
  refused, an empty claim is filled in. Never a node RPC, never an admin operation.
- admin: a token of kind admin. Tenant and quota changes, token management, node drain; may
  act as any tenant (RemoveAll across tenants = RemoveAll with each tenant's name).
- node: `cellarnode_<mac>_<node id>` (cellar.proto.grant.node_credential, derived from the
  cluster secret), or, with no token at all, a client certificate verified against the
  master's `tls_client_ca_file` whose subject CN is `node:<node id>` (mutual TLS, the
  master's `node_listen` port; the interceptor passes the verified id as `peer_node_id`).
  With `refuse_node_credentials` the credential is refused (UNAUTHENTICATED
  `node_credential_refused`): only the certificate makes a node.
  Only the node RPCs, and only with its own node id in the request; the
  service then keeps a node to its own segments (membership refuses a segment of another node).
ClusterStatus is open to every authenticated identity. Any RPC not in `METHOD_POLICY` is
refused (default deny), so a new RPC has to be placed here before anyone can call it.

Every request is authenticated: the token travels in `RequestHeader.token` on gRPC and on the
fast line (one field, one check: `Authorizer.check`), and in `Authorization: Bearer` on HTTP
(`Authorizer.check_http`). A refusal raises `AuthRefused` (UNAUTHENTICATED: no or unknown
credential; PERMISSION_DENIED: known, but not allowed this) and counts
`master_auth_refusals_total{reason}`.

Cost: a verified token is cached by its string (one dict lookup per request afterwards); the
cache is dropped whenever the store changes (create, revoke, a re-read file). Nothing here logs
a token; refusal messages name the token id at most.

Refusals cannot flood anything: a malformed credential (non-ASCII, over MAX_CREDENTIAL_CHARS,
anything the checks cannot even compare) is UNAUTHENTICATED `bad_token` like an unknown one,
counted, never an exception; refusal lines go through one `RefusalLog` (cellar.refusals): at most
one line per peer per `refusal_log_interval_s`, with a count (the peer is `cellar.refusals.PEER`,
which each face sets for the connection or call it serves).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from cellar.errors import ConfigError
from cellar.proto.grant import verify_node_credential
from cellar.refusals import DEFAULT_INTERVAL_S, PEER, RefusalLog
from cellar.tls import NODE_CN_PREFIX
from cellar.tokens import KIND_ADMIN, KIND_TENANT, TokenStore, token_id_of

log = logging.getLogger("cellar.master")
KIND_NODE = "node"
UNAUTHENTICATED = "UNAUTHENTICATED"
PERMISSION_DENIED = "PERMISSION_DENIED"
MAX_CACHED_TOKENS = 4096  # verified tokens remembered; the cache starts over when full
MAX_CREDENTIAL_CHARS = 1024  # longer credentials are malformed (tokens are 60, nodes ~100)

# What each RPC needs (see the module docstring).
TENANT_RPC = "tenant"
NODE_RPC = "node"
ANY_RPC = "any"
METHOD_POLICY = {
    "PutStart": TENANT_RPC, "PutEnd": TENANT_RPC, "PutRevoke": TENANT_RPC,
    "GetReplicas": TENANT_RPC, "Unpin": TENANT_RPC, "Exists": TENANT_RPC,
    "PrefixLen": TENANT_RPC, "Remove": TENANT_RPC, "RemovePrefix": TENANT_RPC,
    "RemoveAll": TENANT_RPC, "ListKeys": TENANT_RPC, "Lookup": TENANT_RPC,
    "WatchKvEvents": TENANT_RPC,
    "MountSegment": NODE_RPC, "UnmountSegment": NODE_RPC, "Heartbeat": NODE_RPC,
    "ReportObjects": NODE_RPC,
    "ClusterStatus": ANY_RPC,
}


@dataclass(frozen=True, slots=True)
class Identity:
    kind: str            # tenant | admin | node
    tenant: str = ""     # tenant tokens: the tenant they act as
    node_id: str = ""    # node credentials: the node they prove
    token_id: str = ""   # tenant/admin tokens: the public id (for messages, never the token)
    shm: bool = False    # trusted on the nodes' hosts: may be shown shm endpoints

    @property
    def admin(self) -> bool:
        return self.kind == KIND_ADMIN


class AuthRefused(Exception):
    """A request the master will not serve; `code` is the gRPC status name, `reason` the
    metric label."""

    def __init__(self, code: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


class Authorizer:
    """Authenticates tokens against one TokenStore and the cluster secret; applies METHOD_POLICY."""

    def __init__(self, store: TokenStore, secret: bytes, *,
                 refusal_log_interval_s: float = DEFAULT_INTERVAL_S,
                 refuse_node_credentials: bool = False) -> None:
        self.store = store
        self._secret = secret
        # nodes join only by certificate (MasterConfig.refuse_node_credentials)
        self.refuse_node_credentials = refuse_node_credentials
        self._cache: dict[str, Identity] = {}
        self._cache_generation = store.generation
        self.refusals: dict[str, int] = {}
        self.refusal_log = RefusalLog(log, "master", interval_s=refusal_log_interval_s)

    # ---- identities

    def authenticate(self, token: str) -> Identity:
        """The identity `token` proves; AuthRefused(UNAUTHENTICATED) if none."""
        if self._cache_generation != self.store.generation:
            self._cache.clear()
            self._cache_generation = self.store.generation
        identity = self._cache.get(token)
        if identity is not None:
            return identity
        if not token:
            raise self._refuse(UNAUTHENTICATED, "no_token", "no credential: send a token "
                               "(token=, $CELLAR_TOKEN or the file `cellar up` writes)")
        if len(token) > MAX_CREDENTIAL_CHARS or not token.isascii():
            raise self._refuse(UNAUTHENTICATED, "bad_token", "malformed credential")
        try:
            node_id = verify_node_credential(self._secret, token)
            record = None if node_id is not None else self.store.lookup(token)
        except (TypeError, ValueError):  # belt and braces: no credential reaches a traceback
            raise self._refuse(UNAUTHENTICATED, "bad_token", "malformed credential") from None
        if node_id is not None:
            if self.refuse_node_credentials:
                raise self._refuse(UNAUTHENTICATED, "node_credential_refused",
                                   f"node {node_id}: this master takes nodes by certificate "
                                   "only (refuse_node_credentials): join on its node_listen "
                                   "port with a node certificate")
            identity = Identity(KIND_NODE, node_id=node_id)
        else:
            if record is None and self.refresh():  # created in the file since the last tick
                record = self.store.lookup(token)
            if record is None:
                token_id = token_id_of(token)
                raise self._refuse(UNAUTHENTICATED, "bad_token", "unknown or revoked token"
                                   + (f" {token_id}" if token_id else ""))
            identity = Identity(record.kind, tenant=record.tenant, token_id=record.id,
                                shm=record.shm)
        if len(self._cache) >= MAX_CACHED_TOKENS:
            self._cache.clear()
        self._cache[token] = identity
        return identity

    def refresh(self) -> bool:
        """Pick up a changed store file (the master's tick, an unknown token); True if it
        changed. A file that no longer parses keeps the tokens read before (and says so)."""
        try:
            return self.store.refresh()
        except ConfigError as exc:
            log.warning("token store not reloaded, keeping the previous tokens: %s", exc)
            return False

    # ---- the one check of every RPC (gRPC interceptor and fast line)

    def check(self, method: str, request: Any, peer_node_id: str = "") -> Identity:
        """Authenticate and authorize one RPC request; for a tenant token, the request's
        header names that tenant afterwards. `peer_node_id`: the node a verified client
        certificate names (mutual TLS), the identity of a request without a token; a token,
        when sent, decides as before. Raises AuthRefused."""
        header = request.header
        if peer_node_id and not header.token:
            identity = Identity(KIND_NODE, node_id=peer_node_id)
        else:
            identity = self.authenticate(header.token)
        policy = METHOD_POLICY.get(method)
        if policy == TENANT_RPC:
            kind = identity.kind
            if kind == KIND_TENANT:
                claimed = header.tenant
                if not claimed:
                    header.tenant = identity.tenant
                elif claimed != identity.tenant:
                    raise self._refuse(PERMISSION_DENIED, "foreign_tenant",
                                       f"token {identity.token_id} is for tenant "
                                       f"{identity.tenant!r}, not {claimed!r}")
            elif kind != KIND_ADMIN:
                raise self._refuse(PERMISSION_DENIED, "not_a_client",
                                   f"{method} is a client RPC; node credentials cannot call it")
        elif policy == NODE_RPC:
            if identity.kind != KIND_NODE:
                raise self._refuse(PERMISSION_DENIED, "not_a_node",
                                   f"{method} is a node RPC: it needs a node credential")
            if request.node_id != identity.node_id:
                raise self._refuse(PERMISSION_DENIED, "foreign_node",
                                   f"node {identity.node_id!r} cannot act as {request.node_id!r}")
        elif policy != ANY_RPC:
            raise self._refuse(PERMISSION_DENIED, "unknown_rpc", f"{method} is not open to anyone")
        return identity

    # ---- HTTP (admin API)

    def check_http(self, authorization: str, *, admin: bool) -> Identity:
        """Authenticate an `Authorization: Bearer <token>` header; `admin` requires an admin."""
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            token = ""
        identity = self.authenticate(token.strip())
        if admin and not identity.admin:
            raise self._refuse(PERMISSION_DENIED, "not_admin", "this endpoint needs an admin token")
        return identity

    def _refuse(self, code: str, reason: str, message: str) -> AuthRefused:
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        self.refusal_log.note(PEER.get(), reason, message)
        return AuthRefused(code, reason, message)

    def collector(self) -> Collector:
        return _RefusalCollector(self)


class _RefusalCollector(Collector):
    def __init__(self, authorizer: Authorizer) -> None:
        self._authorizer = authorizer

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("master_auth_refusals", "requests refused by authentication "
                                     "or authorization, by reason", labels=["reason"])
        for reason, count in sorted(self._authorizer.refusals.items()):
            family.add_metric([reason], count)
        yield family


def node_id_of_peer(common_names: list[bytes]) -> str:
    """The node a verified peer certificate names (its subject CN `node:<id>`), else ""."""
    for name in common_names:
        text = name.decode("utf-8", "replace")
        if text.startswith(NODE_CN_PREFIX) and len(text) > len(NODE_CN_PREFIX):
            return text[len(NODE_CN_PREFIX):]
    return ""


# The identity of the request being served, for the few bodies that shape a reply by it (shm
# endpoints). Set by the gRPC interceptor and the fast line around each call.
CURRENT_IDENTITY: ContextVar[Identity | None] = ContextVar("cellar_identity", default=None)


def current_identity() -> Identity | None:
    return CURRENT_IDENTITY.get()
