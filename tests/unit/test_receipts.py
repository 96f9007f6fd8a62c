"""Receipts (proto/receipt.py): `is_exactly`, the master's fast test of a PutEnd's receipts,
accepts exactly what `check` accepts: the one authentic receipt of exactly the granted fields."""

from __future__ import annotations

import random

import pytest

from cellar.proto.receipt import RECEIPT_BYTES, Receipt, ReceiptRejected, ReceiptSigner

SECRET = bytes(range(32))
FIELDS = {"alloc_id": 7 << 22 | 12345, "segment_id": 3, "offset": 65536 * 77, "length": 65536,
          "epoch": 7, "key_tag": 0xFEDC_BA98_7654_3210, "checksum": 42}


def _check_accepts(signer: ReceiptSigner, raw: bytes, fields: dict[str, int]) -> bool:
    try:
        signer.check(raw, Receipt(**fields))
    except ReceiptRejected:
        return False
    return True


def test_the_exact_receipt_passes() -> None:
    signer = ReceiptSigner(SECRET)
    raw = signer.sign(**FIELDS)
    assert len(raw) == RECEIPT_BYTES
    assert signer.is_exactly(raw, *FIELDS.values())


@pytest.mark.parametrize("name", list(FIELDS))
def test_any_other_field_fails(name: str) -> None:
    signer = ReceiptSigner(SECRET)
    raw = signer.sign(**FIELDS)
    other = {**FIELDS, name: FIELDS[name] + 1}
    assert not signer.is_exactly(raw, *other.values())
    assert not _check_accepts(signer, raw, other)


def test_a_forged_truncated_or_foreign_receipt_fails() -> None:
    signer = ReceiptSigner(SECRET)
    raw = signer.sign(**FIELDS)
    flipped = bytes([raw[-1] ^ 1])
    for bad in (raw[:-1] + flipped, raw[:-1], raw + b"\0", b"",
                ReceiptSigner(bytes(32)).sign(**FIELDS)):  # another cluster's secret
        assert not signer.is_exactly(bad, *FIELDS.values())
        assert not _check_accepts(signer, bad, FIELDS)


def test_is_exactly_agrees_with_check_on_random_receipts() -> None:
    signer = ReceiptSigner(SECRET)
    rng = random.Random(1912)
    for _ in range(2000):
        signed = {name: rng.choice([value, rng.randrange(1 << 20)]) for name, value in FIELDS.items()}
        signed["alloc_id"] = max(1, signed["alloc_id"])
        raw = signer.sign(**signed)
        if rng.random() < 0.2:  # a damaged byte anywhere
            at = rng.randrange(len(raw))
            raw = raw[:at] + bytes([raw[at] ^ 0x40]) + raw[at + 1:]
        assert signer.is_exactly(raw, *FIELDS.values()) == _check_accepts(signer, raw, FIELDS)
