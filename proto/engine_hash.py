"""The engine hash of an object as a wire contract: `PutItem.engine_hash` bytes <-> the value.

An engine adapter records, with each object it writes, the engine's own hash of the page or
chunk the object holds (SGLang: its page hash as the signed 64-bit int of SGLang's own KV
events; LMCache: the chunk hash of its `CacheEngineKey`; a vLLM-style engine: a bytes digest).
KV events carry it in `block_hashes`, so a router that hashes tokens as the engine does
matches Cellar's events to its own. The SDK encodes it, the master bounds-checks and stores the
bytes without reading them, the events decode it: the layout lives here once.

Layout (at most `MAX_ENGINE_HASH_BYTES`; empty means "no engine hash": events then carry the
key's own 64-bit hash)
    b"\\x01" + 9 bytes, two's complement big-endian: an int in [-2**63, 2**64), which covers
              signed (SGLang, Python `hash`) and unsigned (sha-truncated) 64-bit hashes alike;
    b"\\x02" + 1..32 bytes: a bytes hash, as is.
"""

from __future__ import annotations

KIND_INT = 1
KIND_BYTES = 2
INT_BODY_BYTES = 9
MAX_HASH_BYTES = 32                       # a bytes hash: up to a SHA-256 digest
MAX_ENGINE_HASH_BYTES = 1 + MAX_HASH_BYTES
MIN_INT = -(1 << 63)
MAX_INT = (1 << 64) - 1


def encode(value: int | bytes) -> bytes:
    """The wire bytes of an engine hash; ValueError for a value outside the layout."""
    if isinstance(value, bool):
        raise ValueError("an engine hash is an int or bytes, not a bool")
    if isinstance(value, int):
        if not MIN_INT <= value <= MAX_INT:
            raise ValueError(f"an int engine hash must lie in [-2**63, 2**64), got {value}")
        return bytes((KIND_INT,)) + value.to_bytes(INT_BODY_BYTES, "big", signed=True)
    if isinstance(value, (bytes, bytearray)):
        if not 1 <= len(value) <= MAX_HASH_BYTES:
            raise ValueError(f"a bytes engine hash holds 1..{MAX_HASH_BYTES} bytes, "
                             f"got {len(value)}")
        return bytes((KIND_BYTES,)) + bytes(value)
    raise ValueError(f"an engine hash is an int or bytes, not {type(value).__name__}")


def error(raw: bytes) -> str:
    """Why `raw` is not a valid encoding ("" when it is, or when it is empty)."""
    if not raw:
        return ""
    if len(raw) > MAX_ENGINE_HASH_BYTES:
        return f"engine_hash is over {MAX_ENGINE_HASH_BYTES} bytes"
    kind = raw[0]
    if kind == KIND_INT and len(raw) == 1 + INT_BODY_BYTES:
        if MIN_INT <= int.from_bytes(raw[1:], "big", signed=True) <= MAX_INT:
            return ""
        return "engine_hash int is out of range"
    if kind == KIND_BYTES and len(raw) >= 2:
        return ""
    return "engine_hash is not a valid encoding (proto/engine_hash.py)"


def decode(raw: bytes) -> int | bytes:
    """The value of a valid, non-empty encoding (checked by `error` when it was stored)."""
    assert raw and not error(raw), raw
    if raw[0] == KIND_INT:
        return int.from_bytes(raw[1:], "big", signed=True)
    return bytes(raw[1:])
