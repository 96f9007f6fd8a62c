"""Who holds a slot on the data port: connections that proved a grant, and strangers on a clock.

A storage node's data port serves only requests that carry a grant the master signed, but a
TCP connection costs the node a thread and a slot before it has said anything. Without a rule,
64 idle connections from one address took every slot that address had, and with it every
same-host client's put (issue #19). The rule (`TcpDataServer(auth_timeout_s=...)`):

- A connection is *unauthenticated* from accept until it sends a frame whose grant the access
  layer finds authentic: the request was served, or refused for a reason that is only checked
  after the grant's MAC (expired, stale epoch, out of range, sealed: `AUTHENTIC_REFUSALS`).
  PING carries no grant and proves nothing; an RDMA_CONNECT carries one like a data op.
- An unauthenticated connection must prove itself within `auth_timeout_s` of accept, or it is
  closed (reason `auth_timeout`). An authenticated one keeps the usual deadlines (idle_timeout_s).
- Only unauthenticated connections count against `max_connections_per_peer`. At that limit, a
  new connection from a *proven* address (one that holds an authenticated connection, or held
  one within PROVEN_MEMORY_S) closes the oldest unauthenticated connection of that address
  (reason `unauthenticated_per_peer`): a client that shares its address with a stranger (the
  same host, a NAT) is never refused. A new connection from an unproven address at its limit
  is refused at once (`max_connections_per_peer`): nobody there has shown a grant yet, and
  refusing costs less than churning threads. Renewing does not help a stranger either: a
  connection from an unproven address that ends without a grant keeps its slot charged to
  that address for `unauthenticated_backoff_s`, so such an address holds at most
  max_connections_per_peer connections per backoff period, not per auth_timeout_s.
- When all `max_connections` are taken, a new connection closes the oldest unauthenticated one
  of any address (`unauthenticated_max_connections`); only when every slot holds an
  authenticated connection is it refused (`max_connections`).
So a stranger holds at most max_connections_per_peer slots per address, each for at most
auth_timeout_s, and never a slot an authenticated client holds or needs: a client's new
connection sends its grant within a round trip, long before a flood could push it out.

Without auth_timeout_s (the transfer layer used on its own, no grants) the old rule holds: every
connection counts against both limits and those over them are refused at once.

`Admission` keeps the books under one lock (the accept thread and connection threads share
it); the server closes what it says to close, outside the lock. It never touches a socket's
bytes and never blocks.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from cellar.transfer.frame import (
    ST_BUSY,
    ST_EXPIRED,
    ST_OUT_OF_RANGE,
    ST_SEALED,
    ST_STALE_EPOCH,
)

# Refusals raised only after the grant's MAC verified (cellar.proto.grant.verify checks the MAC
# first; the node's access layer checks range, seal, transfers in flight and key after it).
AUTHENTIC_REFUSALS = frozenset({ST_EXPIRED, ST_STALE_EPOCH, ST_OUT_OF_RANGE, ST_SEALED, ST_BUSY})

# Why a connection was refused or closed: the `reason` label of node_connections_refused_total.
REFUSED_MAX_CONNECTIONS = "max_connections"
REFUSED_PER_PEER = "max_connections_per_peer"  # the old rule (no auth_timeout_s)
EVICTED_PER_PEER = "unauthenticated_per_peer"
EVICTED_MAX_CONNECTIONS = "unauthenticated_max_connections"
AUTH_TIMEOUT = "auth_timeout"
# How long an address stays proven after its last authenticated connection (a client between
# two batches may hold no connection at all), and how many addresses are remembered.
PROVEN_MEMORY_S = 600.0
MAX_PROVEN_ADDRESSES = 4096
CONNECTION_REFUSAL_REASONS = (REFUSED_MAX_CONNECTIONS, REFUSED_PER_PEER, EVICTED_PER_PEER,
                              EVICTED_MAX_CONNECTIONS, AUTH_TIMEOUT)


class Slot:
    """One accepted connection: its socket (the TLS one once wrapped), peer address, state."""

    __slots__ = ("sock", "host", "authenticated", "evicted", "thread")

    def __init__(self, sock: Any, host: str, authenticated: bool) -> None:
        self.sock = sock
        self.host = host
        self.authenticated = authenticated
        self.evicted = False  # closed to make room: its thread is on its way out
        self.thread: threading.Thread | None = None


class Admission:
    """The books of the data port's slots (module docstring). `strict`: the auth rule."""

    def __init__(self, max_connections: int, max_connections_per_peer: int, *,
                 strict: bool, unauthenticated_backoff_s: float = 10.0) -> None:
        assert max_connections_per_peer >= 1 and max_connections >= 1
        self.max_connections = max_connections
        self.max_connections_per_peer = max_connections_per_peer
        self.strict = strict
        self._lock = threading.Lock()
        self._slots: set[Slot] = set()
        self._evicting = 0  # slots evicted whose thread has not released them yet
        # strict: the unauthenticated slots in accept order, in all and per address;
        # otherwise: every slot per address (the old rule)
        self._unauth: OrderedDict[Slot, None] = OrderedDict()
        self._by_host: dict[str, OrderedDict[Slot, None]] = {}
        # strict: addresses that showed an authentic grant -> [authenticated connections held,
        # monotonic time of the last one], oldest first, at most MAX_PROVEN_ADDRESSES
        self._proven: OrderedDict[str, list[float]] = OrderedDict()
        # strict: unproven address -> monotonic expiry of each charge of a connection that
        # ended without a grant (at most max_connections_per_peer each, MAX_PROVEN_ADDRESSES
        # addresses: the oldest address is forgotten first)
        self.unauthenticated_backoff_s = unauthenticated_backoff_s
        self._charges: OrderedDict[str, list[float]] = OrderedDict()

    def admit(self, sock: Any, host: str, stopping: bool = False,
              ) -> tuple[Slot | None, str, list[tuple[Slot, str]]]:
        """A slot for a new connection from `host` (None: refused, with the reason), and the
        connections to close to make room for it, each with its reason."""
        victims: list[tuple[Slot, str]] = []
        with self._lock:
            if stopping:
                return None, REFUSED_MAX_CONNECTIONS, victims
            mine = self._by_host.get(host)
            held = len(mine or ())
            if self.strict and self._is_proven(host):
                if held >= self.max_connections_per_peer:
                    assert mine is not None
                    victims.append((self._evict(next(iter(mine))), EVICTED_PER_PEER))
            elif held + (self._charged(host) if self.strict else 0) \
                    >= self.max_connections_per_peer:
                return None, REFUSED_PER_PEER, victims
            if len(self._slots) - self._evicting >= self.max_connections:
                if not (self.strict and self._unauth):
                    return None, REFUSED_MAX_CONNECTIONS, victims
                victims.append((self._evict(next(iter(self._unauth))), EVICTED_MAX_CONNECTIONS))
            slot = Slot(sock, host, authenticated=False)
            self._slots.add(slot)
            self._by_host.setdefault(host, OrderedDict())[slot] = None
            if self.strict:
                self._unauth[slot] = None
        return slot, "", victims

    def authenticated(self, slot: Slot) -> None:
        """`slot` sent an authentic grant: it no longer counts against the per-peer limit."""
        with self._lock:
            if slot.authenticated or slot.evicted or not self.strict:
                return
            slot.authenticated = True
            self._forget_unauth(slot)
            proven = self._proven.pop(slot.host, None) or [0, 0.0]
            proven[0] += 1
            proven[1] = time.monotonic()
            self._proven[slot.host] = proven  # the newest last
            while len(self._proven) > MAX_PROVEN_ADDRESSES:
                self._proven.popitem(last=False)

    def replace_sock(self, slot: Slot, sock: Any) -> None:
        with self._lock:
            slot.sock = sock

    def release(self, slot: Slot) -> None:
        """The connection's thread is done with it."""
        with self._lock:
            if slot not in self._slots:
                return
            self._slots.discard(slot)
            if slot.evicted:
                self._evicting -= 1
            else:
                self._forget_unauth(slot)
            proven = self._proven.get(slot.host) if slot.authenticated else None
            if proven is not None:
                proven[0] -= 1
                proven[1] = time.monotonic()
            elif self.strict and not slot.evicted and not slot.authenticated \
                    and not self._is_proven(slot.host):
                self._charge(slot.host)

    def slots(self) -> list[Slot]:
        with self._lock:
            return list(self._slots)

    def _charged(self, host: str) -> int:
        """Slots still charged to `host` for connections that ended without a grant."""
        charges = self._charges.get(host)
        if charges is None:
            return 0
        now = time.monotonic()
        while charges and charges[0] <= now:
            charges.pop(0)
        if not charges:
            del self._charges[host]
        return len(charges)

    def _charge(self, host: str) -> None:
        charges = self._charges.setdefault(host, [])
        charges.append(time.monotonic() + self.unauthenticated_backoff_s)
        del charges[:-self.max_connections_per_peer]  # more could never matter
        self._charges.move_to_end(host)
        while len(self._charges) > MAX_PROVEN_ADDRESSES:
            self._charges.popitem(last=False)

    def _is_proven(self, host: str) -> bool:
        proven = self._proven.get(host)
        return proven is not None and (
            proven[0] > 0 or time.monotonic() - proven[1] < PROVEN_MEMORY_S)

    def _evict(self, slot: Slot) -> Slot:
        slot.evicted = True
        self._evicting += 1
        self._forget_unauth(slot)
        return slot

    def _forget_unauth(self, slot: Slot) -> None:
        self._unauth.pop(slot, None)
        mine = self._by_host.get(slot.host)
        if mine is not None:
            mine.pop(slot, None)
            if not mine:
                del self._by_host[slot.host]
