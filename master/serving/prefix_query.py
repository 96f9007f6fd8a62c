"""The prefix query of Mooncake's KV indexer API (RFC kvcache-ai/Mooncake#1403, which NVIDIA
Dynamo's standalone indexer follows), so an indexer or router that speaks it asks Cellar
directly how much of a prompt's prefix Cellar holds, per medium.

    POST /query_by_hash   Authorization: Bearer <tenant token (or admin token + "tenant_id")>
    {"model": "m", "seq_hashes": [h0, h1, ...], "block_size": 16,        ("block_hash" and
     "tenant_id": "default", "instance_id": "...", "lora_name": "...", "cache_salt": ""}
                                                                            "block_hashes" too)
    POST /query           the same with "token_ids": [...] instead of hashes, and
                          "hash_scheme": "sglang" (Cellar's field; the default)
 -> {"<tenant>": {"<instance_id or 'cellar'>": {"longest_matched": tokens, "CPU": tokens,
                                                 "DISK": tokens, "DP": {"0": tokens}}}}

What it answers
    The leading run of the given block hashes that the tenant holds as engine hashes (the hash
    an adapter recorded with each object at put time, `PutItem.engine_hash`; the hashes KV
    events carry), times `block_size`, in tokens. A hash counts as held while at least one
    visible object carries it (an MHA page of SGLang is 2 objects per rank with the same hash:
    one of them suffices here; the SDK's `lookup` over the page's keys is the exact answer).
    The index is per tenant and across models (an engine hash names its prefix, and SGLang's
    and LMCache's hash their tokens without the model): `model`, `lora_name` and `instance_id`
    are accepted and not used to scope. The matched run is split by medium as KV events name
    it: "DISK" counts the blocks of the run held on nodes' disk tiers only (every version
    carrying the hash has all its replicas there), "CPU" the rest (at least one version has a
    replica in DRAM); the two add up to "longest_matched".

Token ids (`/query`)
    Answered for the adapter formats whose page hash Cellar can reproduce: `sglang` (SGLang's
    HiCache storage page hash: SHA-256 chained over pages of u32 little-endian token ids, the
    first page unseeded, as `get_storage_hash_str(tokens, None, page_size)` for a request
    without extra key or cache salt; the event hash is its first 8 bytes as a signed int64,
    `hash_str_to_int64`). Only whole blocks count. A `cache_salt` or a token id beyond u32
    (SGLang hashes those another way) is refused with 400 rather than answered wrongly.
    LMCache's chunk hash depends on the engine's hash function and seed: not reproducible here.

Limits: `MAX_QUERY_BLOCKS` hashes or whole blocks per query, `MAX_BLOCK_SIZE` tokens per block,
`MAX_NAME_CHARS` per string field; the HTTP body limit (1 MiB) bounds the token list first.
401 without a valid token, 403 for another tenant, 400 for a malformed body, 503 off the leader.
It reads the tenant's index only: a query never changes anything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from cellar.http import HttpServer, Request, Response
from cellar.master.serving.auth import UNAUTHENTICATED, Authorizer, AuthRefused
from cellar.master.serving.kv_events import MEDIUM_DISK, MEDIUM_DRAM  # the events' names
from cellar.master.serving.leadership import Leadership
from cellar.master.state.records import Obj, on_disk_only
from cellar.proto import engine_hash

MAX_QUERY_BLOCKS = 65_536          # hashes (or whole blocks of token ids) per query
MAX_BLOCK_SIZE = 1 << 20           # tokens per block
MAX_NAME_CHARS = 256               # model, lora_name, instance_id, tenant_id, cache_salt
MAX_TOKEN_ID = (1 << 32) - 1       # SGLang's u32 page encoding
HASH_SCHEMES = ("sglang",)
INSTANCE = "cellar"


class QueryError(Exception):
    """A malformed query (400)."""


def sglang_page_hashes(token_ids: Sequence[int], page_size: int) -> list[int]:
    """SGLang's event hashes of the whole pages of `token_ids` (see the module docstring)."""
    out: list[int] = []
    prior = b""
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        page = token_ids[start:start + page_size]
        digest = hashlib.sha256(prior + b"".join(t.to_bytes(4, "little") for t in page)).digest()
        prior = digest
        out.append(int.from_bytes(digest[:8], "big", signed=True))
    return out


def leading_held(held: dict[bytes, list[Obj]], hashes: Sequence[int]) -> tuple[int, int]:
    """How many leading `hashes` the tenant's engine-hash index holds, and how many of those
    are held on disk only (every version carrying the hash has all its replicas on nodes'
    disk tiers; one version in DRAM makes the block a DRAM block)."""
    count = on_disk = 0
    for value in hashes:
        versions = held.get(engine_hash.encode(value))
        if not versions:
            break
        count += 1
        if all(on_disk_only(obj) for obj in versions):
            on_disk += 1
    return count, on_disk


def _int_list(body: dict[str, Any], name: str, low: int, high: int) -> list[int]:
    values = body.get(name)
    if not isinstance(values, list) or len(values) > MAX_QUERY_BLOCKS * (
            1 if name != "token_ids" else MAX_BLOCK_SIZE):
        raise QueryError(f"{name} must be a list")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise QueryError(f"{name} must hold ints in [{low}, {high}]")
    return values


def _text(body: dict[str, Any], name: str, default: str = "") -> str:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str) or len(value) > MAX_NAME_CHARS:
        raise QueryError(f"{name} must be a string of at most {MAX_NAME_CHARS} characters")
    return value


def query_hashes(body: dict[str, Any], by_tokens: bool) -> tuple[list[int], int]:
    """The block hashes a query asks about and its block size (QueryError if malformed)."""
    block_size = body.get("block_size")
    if isinstance(block_size, bool) or not isinstance(block_size, int) \
            or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise QueryError(f"block_size must be an int in [1, {MAX_BLOCK_SIZE}]")
    for name in ("model", "lora_name", "instance_id"):
        _text(body, name)
    if not by_tokens:
        name = next((n for n in ("seq_hashes", "block_hash", "block_hashes") if n in body),
                    "seq_hashes")
        hashes = _int_list(body, name, engine_hash.MIN_INT, engine_hash.MAX_INT)
        if len(hashes) > MAX_QUERY_BLOCKS:
            raise QueryError(f"more than {MAX_QUERY_BLOCKS} hashes")
        return hashes, block_size
    scheme = _text(body, "hash_scheme", "sglang")
    if scheme not in HASH_SCHEMES:
        raise QueryError(f"hash_scheme {scheme!r} is not one Cellar can reproduce "
                         f"({', '.join(HASH_SCHEMES)}); use /query_by_hash")
    if _text(body, "cache_salt"):
        raise QueryError("cache_salt: SGLang seeds salted chains differently; "
                         "use /query_by_hash with the engine's own hashes")
    tokens = _int_list(body, "token_ids", 0, MAX_TOKEN_ID)
    if len(tokens) // block_size > MAX_QUERY_BLOCKS:
        raise QueryError(f"more than {MAX_QUERY_BLOCKS} whole blocks")
    return sglang_page_hashes(tokens, block_size), block_size


def add_prefix_query_routes(server: HttpServer, leadership: Leadership,
                            authorizer: Authorizer) -> None:
    def route(by_tokens: bool):  # type: ignore[no-untyped-def]
        async def answer(request: Request) -> Response:
            try:
                identity = authorizer.check_http(request.header("authorization"), admin=False)
            except AuthRefused as exc:
                return Response.json({"error": exc.message},
                                     401 if exc.code == UNAUTHENTICATED else 403)
            if not leadership.serving():
                return Response.json({"error": leadership.redirect(),
                                      "leader": leadership.redirect_address()}, 503)
            body = request.json()
            if not isinstance(body, dict):
                return Response.json({"error": "expected a JSON object"}, 400)
            try:
                asked = _text(body, "tenant_id", identity.tenant)
                hashes, block_size = query_hashes(body, by_tokens)
                instance = _text(body, "instance_id") or INSTANCE
            except QueryError as exc:
                return Response.json({"error": str(exc)}, 400)
            tenant = asked if identity.admin else identity.tenant
            if asked != tenant:
                return Response.json({"error": f"this token is for tenant {tenant!r}"}, 403)
            record = leadership.service.tenants.by_name.get(tenant)  # a query creates none
            held, on_disk = leading_held(record.engine_hashes if record is not None else {},
                                         hashes)
            tokens = held * block_size
            return Response.json({tenant: {instance: {
                "longest_matched": tokens, MEDIUM_DRAM: (held - on_disk) * block_size,
                MEDIUM_DISK: on_disk * block_size, "DP": {"0": tokens}}}})
        return answer

    server.route("POST", "/query_by_hash", route(False))
    server.route("POST", "/query", route(True))
