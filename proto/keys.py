"""Keys as a wire contract: the batch check both sides run before any per-key work.

A key is a non-empty UTF-8 string of at most `max_key_bytes` bytes; the master also refuses a
NUL in it. Engines send keys in batches of hundreds (a prefix probe of 256 page keys), and a
per-key check in Python costs about 0.6 us a key, more than the probe's own lookups. Almost
every real key is plain ASCII, so `all_plain_keys` settles a whole batch in C loops (join,
isascii, min/max of the lengths) and only a batch it cannot vouch for takes the key-by-key
path that names the first bad key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["all_plain_keys"]


def all_plain_keys(keys: Sequence[Any], max_key_bytes: int) -> bool:
    """True when every item is a non-empty ASCII str (so its UTF-8 size is its length and it
    holds no lone surrogate) of at most `max_key_bytes`, with no NUL: valid for the SDK and
    the master alike. False says nothing: check key by key."""
    if not keys:
        return False
    try:
        joined = "".join(keys)  # refuses anything that is not a str
    except TypeError:
        return False
    return (joined.isascii() and "\x00" not in joined
            and min(map(len, keys)) > 0 and max(map(len, keys)) <= max_key_bytes)
