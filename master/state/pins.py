"""Pins (read leases): a reader's hold on an object version between GetReplicas and Unpin.

Owns the pin table. GetReplicas creates one pin per object it returns; Unpin (or the unpin ids
riding on the next GetReplicas) releases it; a pin nobody released expires after `pin_ttl_s`
(the reader crashed), which is also the expiry of the read grants handed out with it.

Invariant: `obj.pins` equals the number of live pins on `obj`; an object with pins > 0 is never
evicted and its ranges are never released (a removed pinned object is invisible but keeps its
bytes until the last pin goes). Every pin has the same TTL, so creation order is expiry order
and the sweep pops a FIFO. Pin ids are random (cellar.master.state.ids) and bound to the tenant
that received them: an Unpin from another tenant releases nothing. Each client id holds at most `max_pins_per_client` pins. This module
never frees ranges itself: the last unpin calls back into the object table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cellar.master.state.expiry import ExpiryRuns
from cellar.master.state.ids import SecretIds
from cellar.master.state.records import DROPPED

if TYPE_CHECKING:
    from cellar.master.state.records import Obj, Tenant


class Pin:
    __slots__ = ("obj", "tenant", "client_id")

    def __init__(self, obj: Obj, tenant: Tenant, client_id: str) -> None:
        self.obj = obj
        self.tenant = tenant
        self.client_id = client_id


class PinTable:
    def __init__(
        self,
        *,
        ttl_s: float,
        max_per_client: int,
        on_first_pin: Callable[[Obj], None],
        on_last_unpin: Callable[[Obj], None],
    ) -> None:
        self.ttl_s = ttl_s
        self.max_per_client = max_per_client
        self._next_id = SecretIds().next  # unguessable: Unpin quotes it (cellar.master.state.ids)
        self._on_first_pin = on_first_pin
        self._on_last_unpin = on_last_unpin
        self.pins: dict[int, Pin] = {}
        self._expiry = ExpiryRuns()  # pin ids by expiry, in creation order
        self.per_client: dict[str, int] = {}
        self.expired_total = 0

    def __len__(self) -> int:
        return len(self.pins)

    def pin(self, obj: Obj, tenant: Tenant, client_id: str, now: float) -> int:
        """A new pin id on `obj`, or 0 if the client already holds its maximum."""
        per_client = self.per_client
        held = per_client.get(client_id, 0)
        if held >= self.max_per_client:
            return 0
        assert tenant is obj.tenant and obj.state != DROPPED, "a pin on another tenant's or a dropped object"
        per_client[client_id] = held + 1
        pin_id = self._next_id()
        self.pins[pin_id] = Pin(obj, tenant, client_id)
        self._expiry.add(now + self.ttl_s, pin_id)
        obj.pins += 1
        if obj.pins == 1:
            self._on_first_pin(obj)
        return pin_id

    def unpin(self, pin_id: int, tenant: Tenant) -> bool:
        pin = self.pins.get(pin_id)
        if pin is None or pin.tenant is not tenant:
            return False
        del self.pins[pin_id]
        self._release(pin)
        return True

    def _release(self, pin: Pin) -> None:
        held = self.per_client[pin.client_id] - 1
        assert held >= 0, "a client's pin count went negative"
        if held:
            self.per_client[pin.client_id] = held
        else:
            del self.per_client[pin.client_id]
        obj = pin.obj
        obj.pins -= 1
        assert obj.pins >= 0, "pin count went negative"
        if not obj.pins:
            self._on_last_unpin(obj)

    def sweep(self, now: float) -> int:
        """Release pins whose TTL ran out; returns how many."""
        pins = self.pins
        expired = 0
        for pin_id in self._expiry.pop_due(now):
            pin = pins.pop(pin_id, None)
            if pin is not None:
                self._release(pin)
                expired += 1
        self.expired_total += expired
        return expired
