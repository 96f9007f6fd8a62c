"""The cheaper paths in cellar.proto behave exactly like the plain ones: `fast_frozen_init`
dataclasses and `GrantVerifier` against `verify`."""

from __future__ import annotations

import dataclasses

import pytest

from cellar.proto._fastinit import fast_frozen_init
from cellar.proto.grant import (
    GRANT_OP_READ,
    GRANT_OP_WRITE,
    Grant,
    GrantRejected,
    GrantVerifier,
    sign,
    verify,
)
from cellar.transfer.frame import WriteMeta

SECRET = bytes(range(32))


def test_fast_init_keeps_dataclass_behaviour() -> None:
    g = Grant(1, 2, 3, 4, 5, 6, 7, 8, b"m" * 16)
    assert g == Grant(op=1, segment_id=2, offset=3, length=4, alloc_id=5, epoch=6, expiry_ms=7,
                      key_tag=8, mac=b"m" * 16)
    assert hash(g) == hash(Grant(1, 2, 3, 4, 5, 6, 7, 8, b"m" * 16))
    assert dataclasses.replace(g, length=9).length == 9
    assert repr(g).startswith("Grant(op=1, segment_id=2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.op = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        Grant(1, 2, 3)  # type: ignore[call-arg]
    meta = WriteMeta(1, 2, "t", "k")
    assert meta == WriteMeta(checksum=1, object_size=2, tenant="t", key="k")


def test_fast_init_refuses_what_it_cannot_copy() -> None:
    @dataclasses.dataclass(slots=True)
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithDefault:
        a: int = 0

    for cls in (Mutable, WithDefault):
        with pytest.raises(TypeError):
            fast_frozen_init(cls)


@pytest.mark.parametrize("change", [
    {}, {"mac": b"x" * 16}, {"op": GRANT_OP_READ}, {"epoch": 1}, {"expiry_ms": 1_000},
    {"length": 10},
])
def test_grant_verifier_equals_verify(change: dict) -> None:  # type: ignore[type-arg]
    good = sign(SECRET, op=GRANT_OP_WRITE, segment_id=4, offset=4096, length=100, alloc_id=9,
                epoch=3, expiry_ms=10_000, tag=77)
    grant = dataclasses.replace(good, **change)
    kwargs = dict(op=GRANT_OP_WRITE, segment_id=4, offset=4096, length=100, now_ms=5_000,
                  min_epoch=3, allowed_skew_ms=100)

    def outcome(check):  # type: ignore[no-untyped-def]
        try:
            check()
        except GrantRejected as exc:
            return exc.reason, str(exc)
        return None

    plain = outcome(lambda: verify(SECRET, grant, **kwargs))
    fast = outcome(lambda: GrantVerifier(SECRET).verify(grant, **kwargs))
    assert plain == fast
    assert (plain is None) == (change == {})
