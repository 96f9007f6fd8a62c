"""Early reads: a get starts reading a key under its last grant while GetReplicas is in flight.

Why
    A get is two round trips one after the other: GetReplicas to the master (where the key
    lives, its checksum, a read grant and a pin), then the read from the node. A key this
    client read a moment ago most likely still lives where it did, under a grant that has not
    expired. So a get of such a key sends GetReplicas and, at once, the read under the grant
    it kept (`Locations`); the call then costs the longer of the two round trips instead of
    their sum (docs/benchmarks.md, "validate in parallel"). It saves wall time, not CPU: the
    master is still asked, and pins and hit counts are still its.

Why keeping the bytes is safe
    An early read's bytes are kept only if the GetReplicas reply that arrives with them names
    a replica with the same segment, offset, length and allocation id as the grant read under,
    with the same size and checksum, and the bytes hash to that checksum. An allocation id is
    never used twice, and the reply's pin holds the allocation from the moment the master
    answered; so that allocation was live both when the grant was kept and after the reply,
    hence when the node served the read (an allocation lives one unbroken span): the bytes
    were that object's sealed bytes. The read itself is admitted by the node's same checks as
    any read under an unexpired grant (MAC, epoch, expiry, allocation), a client may already
    re-read under a grant after unpinning, so nothing is read that a client could not read
    before. Any difference (the key removed, replaced, moved to another tier or node; a new
    leader's epoch; a refusal) discards the early bytes and the key is read as usual from the
    reply; a caller's buffer that an early read wrote into and no later read overwrote is
    zeroed, so a miss never leaves another allocation's bytes in it.

Keys this client put
    A key put through a transport that reads the client's own mapping of the segment (shm:
    `Transport.reads_own_mapping`) is remembered at its PutEnd under the put's write grant
    (client/puts.py `PutBatch.written`), so the first get after the put reads early too. No
    node ever sees that grant: the read is a copy out of the mapping the client may read
    anyway, and its range is the one the grant covers. The same checks decide whether its
    bytes are kept (the allocation id of a write grant is the one the read grants of that
    replica carry; the put's PutEnd answered OK, so the allocation was sealed before the
    copy began). A tcp or rdma put remembers nothing: a node reads only under read grants.

Reading without asking (trusted reads)
    A GetReplicas reply grants `read_trust_ms`: until that long after the request was sent
    (less TRUST_MARGIN_S, client/gets.py) the key's DRAM replica is read without asking at all
    (`Location.trusted_until`); the master holds any remove or new version of the key by
    another process until then (master/state/read_trust.py). Before this process removes or
    writes keys, `Locations.changing` ends their trust in every client of the process (they
    share one client id, which the master exempts from waiting) and voids the trust of any
    reply to a request sent before. `$CELLAR_TRUSTED_READS=0` turns it off.

What it keeps and its limits
    `Locations`: key -> the replica last read (route, grant, size, checksum, tier), until
    MARGIN_S before its grant expires by the master's clock (a deadline-bounded get reads
    only DRAM replicas early: a disk read may be slow, and the budget plans those itself); at
    most MAX_LOCATIONS keys (the oldest remembered is forgotten first). A put's replica
    whose tier the client does not know (written under a put-ahead allocation) counts as a
    disk one: a budgeted get does not read it early.
    `$CELLAR_EARLY_READS=0` turns early reads off (read once per client; default on).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from cellar.client import metrics
from cellar.errors import InvalidArgument
from cellar.proto.grant import Grant
from cellar.transfer.base import SegmentRoute

__all__ = ["EARLY_READS_ENV", "MARGIN_S", "MAX_LOCATIONS", "TRUSTED_READS_ENV", "Location",
           "Locations", "early_reads_from_env", "trusted_reads_from_env"]

EARLY_READS_ENV = "CELLAR_EARLY_READS"
TRUSTED_READS_ENV = "CELLAR_TRUSTED_READS"
MAX_LOCATIONS = 4096   # keys remembered per client (about 300 bytes each)
MARGIN_S = 1.0         # a grant is not used for an early read this close to its expiry


@dataclass(slots=True)  # not frozen: a frozen dataclass costs ~1 us more per key read
class Location:
    """The replica a key was last read from, and until when (monotonic s) to try it early."""

    route: SegmentRoute
    grant: Grant
    size: int
    checksum: int
    good_until: float
    disk: bool = False  # a disk-tier replica: not read early by a budgeted get
    # until when (monotonic s) it may be read without asking the master at all (trusted
    # reads, client/gets.py `start_trusted`; master/state/read_trust.py): 0 for a disk replica
    # or one this client put
    trusted_until: float = 0.0


class Locations:
    """Where this client last read each key (bounded; safe from many threads)."""

    def __init__(self, max_keys: int = MAX_LOCATIONS, *, trust: bool = True) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self._max_keys = max_keys
        self.trust = trust  # False: never read without asking (the master's window unused)
        # oldest first; an OrderedDict drops its oldest in O(1), a dict's first key is found
        # by scanning past deleted slots (3.6 vs 0.4 us per key once full, measured)
        self._by_key: OrderedDict[str, Location] = OrderedDict()
        self._lock = threading.Lock()
        self.kept = 0        # early reads whose bytes the reply confirmed
        self.discarded = 0   # early reads read again (or not at all) after the reply
        self.trusted = 0     # keys read without asking the master
        self.untrusted = 0   # trusted reads that failed (the key was then asked for)
        self.looked_up = 0   # one-key gets made as one lookup and one read (client/one_read.py)
        self._changed_at = 0.0  # when this process last began a change (`changing`)
        with _PROCESS_LOCK:  # registered last: `changing` may reach it from now on
            _PROCESS_LOCATIONS.add(self)

    def __len__(self) -> int:
        return len(self._by_key)

    def find(self, key: str, now: float) -> Location | None:
        found = self._by_key.get(key)
        if found is None or found.good_until <= now:
            return None
        return found

    def remember(self, read: Iterable[tuple[str, SegmentRoute, Grant, int, int, bool]],
                 master_time_ms: int, now: float | None = None,
                 trusted_until: float = 0.0, asked_at: float = 0.0) -> None:
        """Keep the replicas a batch just read, (key, route, grant, size, checksum, disk) each;
        `master_time_ms` is the master's clock in the reply that granted them (0: unknown,
        nothing is kept); `trusted_until` (monotonic s) the end of the reply's read trust (its
        DRAM replicas may be read without asking until then), void if the request was sent
        (`asked_at`) before this client began a change (`changing`). One lock for the batch."""
        if not master_time_ms:
            return
        now = time.monotonic() if now is None else now
        base_s = now - master_time_ms / 1000 - MARGIN_S
        if not self.trust:
            trusted_until = 0.0
        fresh = [(key, Location(route, grant, size, checksum, base_s + grant.expiry_ms / 1000,
                                disk, 0.0 if disk else trusted_until))
                 for key, route, grant, size, checksum, disk in read
                 if grant.expiry_ms - master_time_ms > MARGIN_S * 1000]
        if not fresh:
            return
        with self._lock:
            if trusted_until and asked_at <= self._changed_at:
                for _key, location in fresh:
                    location.trusted_until = 0.0
            by_key = self._by_key
            for key, location in fresh:
                if by_key.pop(key, None) is None and len(by_key) >= self._max_keys:
                    by_key.popitem(last=False)
                by_key[key] = location

    def changing(self, keys: Iterable[str] | None) -> None:
        """This client is about to remove or write `keys` (None: keys it cannot name, a prefix
        or all of them). The master does not hold such a change for the trust of the client
        id that made it (master/state/read_trust.py), and every client of this process shares
        that id (connect_args.client_id): so every client of the process stops trusting where
        those keys are (every key: None; they are still read early, which the master's reply
        checks), and trusts no reply to a GetReplicas sent before now (one in flight may name
        the version being changed)."""
        names = None if keys is None else list(keys)
        now = time.monotonic()
        with _PROCESS_LOCK:
            every = list(_PROCESS_LOCATIONS)
        for locations in every:
            locations._changing_here(names, now)

    def _changing_here(self, keys: list[str] | None, now: float) -> None:
        with self._lock:
            self._changed_at = now
            by_key = self._by_key
            if keys is None:
                for location in by_key.values():
                    location.trusted_until = 0.0
                return
            for key in keys:  # kept for early reads: the master's reply still checks those
                found = by_key.get(key)
                if found is not None:
                    found.trusted_until = 0.0

    def forget(self, *keys: str) -> None:
        """Forget where `keys` are: a place a read of it failed, or one another version holds
        now (this client's put, upsert or remove of the key was acknowledged: an early read
        there would only be discarded by the master's reply)."""
        with self._lock:
            by_key = self._by_key
            for key in keys:
                by_key.pop(key, None)

    def counted(self, kept: int, discarded: int) -> None:
        """One batch's early reads, here and in the client metrics."""
        with self._lock:
            self.kept += kept
            self.discarded += discarded
        metrics.record_early_reads(kept, discarded)

    def counted_trusted(self, kept: int, failed: int) -> None:
        """One batch's trusted reads, here and in the client metrics."""
        with self._lock:
            self.trusted += kept
            self.untrusted += failed
        metrics.record_trusted_reads(kept, failed)

    def counted_lookup(self) -> None:
        """A one-key get of a key not known here, made as one lookup and one read."""
        with self._lock:
            self.looked_up += 1


# Every Locations of this process: they share one client id (`changing`)
_PROCESS_LOCATIONS: weakref.WeakSet[Locations] = weakref.WeakSet()
_PROCESS_LOCK = threading.Lock()


def early_reads_from_env() -> bool:
    """Whether gets read early ($CELLAR_EARLY_READS: 1 or unset on, 0 off);
    `cellar.InvalidArgument` for anything else."""
    return _switch(EARLY_READS_ENV)


def trusted_reads_from_env() -> bool:
    """Whether gets read keys without asking within the master's read trust
    ($CELLAR_TRUSTED_READS: 1 or unset on, 0 off); `cellar.InvalidArgument` for anything else."""
    return _switch(TRUSTED_READS_ENV)


def _switch(name: str) -> bool:
    text = os.environ.get(name, "").strip()
    if text in ("", "1"):
        return True
    if text == "0":
        return False
    raise InvalidArgument(f"${name} must be 0 or 1, got {text!r}")
