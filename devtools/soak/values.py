"""Self-describing soak values: any read can be verified on its own.

What it owns
    The value format: a header (`HEADER`: magic `CSK1`, key length, version, body length and a
    16-byte BLAKE2b digest of key, version and body), the key's bytes, then random body bytes.
    `make_value` builds one of a given size; `check_value` returns its version, or None and why
    it is corrupt (short, bad magic, wrong length, another key's value, digest mismatch).

What it must never do
    Trust a value it did not check: a read that does not verify is a CORRUPT read.
"""

from __future__ import annotations

import hashlib
import random
import struct

MAGIC = b"CSK1"
HEADER = struct.Struct("<4sHQI16s")  # magic, key length, version, body length, digest
DIGEST_BYTES = 16


def _digest(key: bytes, version: int, body: bytes | memoryview) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(key)
    h.update(version.to_bytes(8, "little"))
    h.update(body)
    return h.digest()


def make_value(key: str, version: int, size: int, rng: random.Random) -> bytes:
    """A value of `size` bytes (at least the header) that says which key and version it is."""
    kb = key.encode()
    body_len = max(0, size - HEADER.size - len(kb))
    body = rng.randbytes(body_len)
    return HEADER.pack(MAGIC, len(kb), version, body_len, _digest(kb, version, body)) + kb + body


def check_value(key: str, value: bytes) -> tuple[int | None, str]:
    """(version, "") for a well-formed value of `key`; (None, why) for a corrupt one."""
    if len(value) < HEADER.size:
        return None, f"{len(value)} bytes is shorter than the header"
    magic, key_len, version, body_len, digest = HEADER.unpack_from(value)
    if magic != MAGIC:
        return None, f"bad magic {magic!r}"
    if HEADER.size + key_len + body_len != len(value):
        return None, f"length {len(value)} != header {HEADER.size}+{key_len}+{body_len}"
    kb = value[HEADER.size:HEADER.size + key_len]
    if kb != key.encode():
        return None, f"value of key {kb[:80]!r}"
    body = memoryview(value)[HEADER.size + key_len:]
    if _digest(kb, version, body) != digest:
        return None, f"digest mismatch (version {version})"
    return version, ""
