"""The KV format guard: which KV bytes a reader may take, decided before they reach its pool.

Why it exists
    Engines cache KV pages by content hash of the tokens. The same tokens produce different
    bytes under another model, KV dtype, memory layout, page size or parallel split, and an
    engine that consumed such bytes would compute garbage without any error (reference section
    9: "incomplete or version-mismatched KV must not be consumed; cluster upgrades must isolate
    incompatible model versions, KV dtype and layout"). So every adapter states its format as a
    `KVFormat` and the guard enforces two things:

    1. Namespace: every key an adapter writes or reads is `<namespace>/<engine key>`, where the
       namespace is a short hash of the whole format. A reader of another format asks for other
       keys and sees a miss; it never receives the writer's bytes, and never pays a transfer.
    2. Size: the reader knows how many bytes an object of its format holds. An object whose size
       differs is refused, never copied into the pool: `check_size` for fixed-size objects
       (SGLang pages; the SDK refuses a larger object before any transfer, see
       `Client.get_many_into`), and the 32-byte `header` / `verify_header` pair for objects whose
       size varies (LMCache's partial last chunk), which also carries the format's fingerprint
       inside the value so a hash-prefix collision cannot pass either.

    `descriptor()` is the format as JSON; adapters store it once under `<namespace>/format` so
    an operator can tell what a namespace holds (`cellar get kv-.../format`).

Invariants
    A `KVFormat` is immutable and validated at construction; equal fields give the same
    namespace in every process and every release of this module (the hash input is canonical
    JSON of the fields, sorted, with `FORMAT_SCHEMA` in it: changing the schema changes every
    namespace on purpose).

What it must never do
    Import an engine. It is shared by every adapter and must load without SGLang or LMCache.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

from cellar.errors import InvalidArgument

# Bumped when the meaning of a field or the hash input changes: every namespace changes with it.
FORMAT_SCHEMA = 1
# Hex characters of the fingerprint used in key names (64 bits: a collision needs ~4e9 formats
# in one tenant; `verify_header` checks all 128 bits where a value carries a header).
NAMESPACE_HEX_CHARS = 16
DESCRIPTOR_NAME = "format"  # the descriptor's key in a namespace: `descriptor_key()`
FINGERPRINT_BYTES = 16
# magic "CKVF", header version (u16), reserved (u16), fingerprint (16 B), payload size (u64).
_HEADER = struct.Struct("<4sHH16sQ")
HEADER_BYTES = _HEADER.size
_MAGIC = b"CKVF"
_HEADER_VERSION = 1
# Field limits: they end up in every key and in the descriptor object.
MAX_FIELD_CHARS = 256
MAX_PAGE_SIZE_TOKENS = 1 << 20
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:/+\-]+$")


class FormatMismatch(InvalidArgument):
    """An object's bytes are not of the reader's format (other fingerprint or another size).

    Adapters turn it into a miss for that key; it never reaches the engine."""


@dataclass(frozen=True)
class KVFormat:
    """Everything that decides whether two processes may share KV bytes.

    model            model id and revision, as the engine names it (e.g. "Qwen/Qwen3-8B@main")
    kv_dtype         element type of the KV cache ("bfloat16", "float8_e4m3fn", ...)
    layout           the engine's memory layout of a page ("page_first", "layer_first", ...)
    page_size_tokens tokens per page (SGLang page / LMCache chunk)
    parallel_rule    how pages split across ranks, e.g. "tp2" (MHA: one object set per rank) or
                     "mla" (rank-less: every rank holds the same KV)
    adapter          which adapter wrote the objects ("sglang-hicache", "lmcache", ...)
    adapter_version  that adapter's object format version (bump to isolate an incompatible one)
    shape            extra facts that fix the object's bytes, e.g. (("layers", "32"),
                     ("kv_heads", "8"), ("head_dim", "128")); sorted on construction
    """

    model: str
    kv_dtype: str
    layout: str
    page_size_tokens: int
    parallel_rule: str
    adapter: str
    adapter_version: int
    shape: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("model", "kv_dtype", "layout", "parallel_rule", "adapter"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidArgument(f"KVFormat.{name} must be a non-empty string, got {value!r}")
            if len(value) > MAX_FIELD_CHARS:
                raise InvalidArgument(f"KVFormat.{name} is {len(value)} characters, over the "
                                      f"limit of {MAX_FIELD_CHARS}")
        for name in ("kv_dtype", "layout", "parallel_rule", "adapter"):
            if not _NAME_RE.match(getattr(self, name)):
                raise InvalidArgument(f"KVFormat.{name} {getattr(self, name)!r} may only hold "
                                      "letters, digits and _.:/+-")
        if (not isinstance(self.page_size_tokens, int) or isinstance(self.page_size_tokens, bool)
                or not 1 <= self.page_size_tokens <= MAX_PAGE_SIZE_TOKENS):
            raise InvalidArgument(f"KVFormat.page_size_tokens must be an int in "
                                  f"[1, {MAX_PAGE_SIZE_TOKENS}], got {self.page_size_tokens!r}")
        if (not isinstance(self.adapter_version, int) or isinstance(self.adapter_version, bool)
                or self.adapter_version < 0):
            raise InvalidArgument(f"KVFormat.adapter_version must be an int >= 0, "
                                  f"got {self.adapter_version!r}")
        try:
            pairs = tuple(sorted((str(k), str(v)) for k, v in self.shape))
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"KVFormat.shape must be (name, value) pairs: {e}") from None
        if len({k for k, _ in pairs}) != len(pairs):
            raise InvalidArgument(f"KVFormat.shape names a field twice: {pairs!r}")
        if any(len(k) + len(v) > MAX_FIELD_CHARS for k, v in pairs):
            raise InvalidArgument(f"KVFormat.shape entries are limited to {MAX_FIELD_CHARS} "
                                  "characters each")
        object.__setattr__(self, "shape", pairs)
        # Cached once: the namespace sits in every key of a hot path.
        digest = hashlib.blake2b(self._canonical().encode(), digest_size=FINGERPRINT_BYTES)
        object.__setattr__(self, "_fingerprint", digest.digest())

    def _canonical(self) -> str:
        fields = asdict(self)
        fields["shape"] = [list(p) for p in self.shape]
        fields["schema"] = FORMAT_SCHEMA
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    def fingerprint(self) -> bytes:
        """128-bit digest of the whole format (what a header carries)."""
        fp: bytes = self.__dict__["_fingerprint"]
        return fp

    def namespace(self) -> str:
        """Stable short prefix for this format's keys, e.g. "kv-3f9a0c2e1b7d4a55"."""
        return "kv-" + self.fingerprint().hex()[:NAMESPACE_HEX_CHARS]

    def key_prefix(self) -> str:
        """What every Cellar key of this format starts with: `key(name)` is this + name, so a
        listing under it gives back the engine keys (and the descriptor's, `descriptor_key`)."""
        return self.namespace() + "/"

    def key(self, name: str) -> str:
        """The Cellar key of an engine key (page hash, chunk hash) in this format."""
        return self.key_prefix() + name

    def descriptor_key(self) -> str:
        """Where adapters store `descriptor()`, inside the namespace (no engine key is "format":
        LMCache's and SGLang's keys are hashes with fields around them)."""
        return self.key(DESCRIPTOR_NAME)

    def descriptor(self) -> bytes:
        """The format as canonical JSON (stored under `descriptor_key()` by adapters)."""
        return self._canonical().encode()

    def check_size(self, size_bytes: int, expected_bytes: int) -> None:
        """Refuse an object whose size is not the one this format's reader expects."""
        if size_bytes != expected_bytes:
            raise FormatMismatch(f"object of {size_bytes} bytes where format "
                                 f"{self.namespace()} expects {expected_bytes}")

    def header(self, payload_bytes: int) -> bytes:
        """The 32-byte header to store in front of a payload of `payload_bytes`."""
        if not isinstance(payload_bytes, int) or payload_bytes < 0:
            raise InvalidArgument(f"payload_bytes must be an int >= 0, got {payload_bytes!r}")
        return _HEADER.pack(_MAGIC, _HEADER_VERSION, 0, self.fingerprint(), payload_bytes)

    def verify_header(self, header: Any, object_size_bytes: int | None = None) -> int:
        """The payload size a header announces, or `FormatMismatch` if the header is not of
        this format or (given `object_size_bytes`, the stored object's whole size) the object
        is shorter or longer than header + payload."""
        view = memoryview(header).cast("B")
        if view.nbytes < HEADER_BYTES:
            raise FormatMismatch(f"header of {view.nbytes} bytes, need {HEADER_BYTES}")
        magic, version, _reserved, fp, payload = _HEADER.unpack_from(view)
        if magic != _MAGIC or version != _HEADER_VERSION:
            raise FormatMismatch("not a Cellar KV object (bad magic or header version)")
        if fp != self.fingerprint():
            raise FormatMismatch(f"object of another KV format than {self.namespace()}")
        if object_size_bytes is not None and object_size_bytes != HEADER_BYTES + payload:
            raise FormatMismatch(f"object of {object_size_bytes} bytes; its header announces "
                                 f"{HEADER_BYTES} + {payload}")
        return int(payload)

    @classmethod
    def from_descriptor(cls, data: bytes | str) -> KVFormat:
        """The format a descriptor describes (InvalidArgument if it is not one)."""
        try:
            fields = json.loads(data)
            schema = fields.pop("schema")
            fields["shape"] = tuple(tuple(p) for p in fields.get("shape", ()))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise InvalidArgument(f"not a KV format descriptor: {e}") from None
        if schema != FORMAT_SCHEMA:
            raise InvalidArgument(f"descriptor of format schema {schema}, this is {FORMAT_SCHEMA}")
        try:
            return cls(**fields)
        except TypeError as e:
            raise InvalidArgument(f"not a KV format descriptor: {e}") from None


__all__ = ["FINGERPRINT_BYTES", "FORMAT_SCHEMA", "HEADER_BYTES", "FormatMismatch", "KVFormat"]
