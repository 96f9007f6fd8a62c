"""The engine-hash wire layout (proto/engine_hash.py): every value in range round-trips, the
signed and unsigned 64-bit ends and a digest included; everything else is refused at both
ends (the SDK's encode, the master's check of raw bytes)."""

from __future__ import annotations

import pytest

from cellar.proto import engine_hash


@pytest.mark.parametrize("value", [0, -1, 1, -(1 << 63), (1 << 63) - 1, 1 << 63, (1 << 64) - 1,
                                   b"\x00", bytes(range(32))])
def test_round_trip(value: int | bytes) -> None:
    raw = engine_hash.encode(value)
    assert len(raw) <= engine_hash.MAX_ENGINE_HASH_BYTES
    assert engine_hash.error(raw) == ""
    back = engine_hash.decode(raw)
    assert back == value and type(back) is type(value)


@pytest.mark.parametrize("value", [1 << 64, -(1 << 63) - 1, b"", b"x" * 33, "hex", True, 1.5, None])
def test_encode_refuses(value: object) -> None:
    with pytest.raises(ValueError):
        engine_hash.encode(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", [b"\x01", b"\x01" + b"\x00" * 8, b"\x01" + b"\x00" * 10,
                                 b"\x01\x7f" + b"\xff" * 7 + b"\x00",  # above 2**64 - 1
                                 b"\x02", b"\x02" + b"x" * 33, b"\x03abc", b"\x00" * 9])
def test_check_refuses_raw(raw: bytes) -> None:
    assert engine_hash.error(raw) != ""


def test_empty_means_none() -> None:
    assert engine_hash.error(b"") == ""
