"""Read trust: how long a client may read a key again without asking, and what that costs a change.

Why
    A get is two round trips: GetReplicas to the master, then the read from the node. A client
    that read a key moments ago knows where it lives and holds a read grant for it (valid
    `pin_ttl_s`). If it may read it again from there without asking the master, a repeated get
    is one round trip (client/gets.py `start_trusted`). The node checks the grant and that the
    allocation is still sealed there (tcp; over shm the client copies from its own mapping), and
    the client checks the bytes' checksum, so such a read returns that version's bytes or
    nothing. What it could return is an *old* version: one a
    remove or a newer put replaced at the master, before its node heard of it.

The rule that keeps acknowledged changes true
    GetReplicas answers `read_trust_s` (`GetReplicasReply.read_trust_ms`): the client may reuse
    the replicas it names for that long, counted from when it sent the request. So every such
    reuse of a version ends by `read_at + read_trust_s` (`Obj.read_at`: the master's time of the
    last GetReplicas that named it). A remove or a new version of a key read that recently is
    applied at once (later GetReplicas see it) but acknowledged only once that time has passed:
    the servicer holds the reply (`settle_until`, taken by serving/leadership.make_durable). So
    a get that starts after a change was acknowledged sees it, whoever asks and however.

    A version can leave service without a change being acknowledged (eviction, a lost node): a
    later put of the key is such a change. So `dropped` remembers, per key, until when a version
    read lately may still be reused, and `changed` (a remove, a new version sealed) waits for it.

    A change made by the one client id that read the version (`Obj.reader`: the client id of
    every GetReplicas of it within the trust; one per process, client/connect_args.py) does not
    wait: before it sends the change, every client of that process stops trusting the key's
    place and any reply to a GetReplicas sent before (client/early_reads.py
    `Locations.changing`). So a client that puts, reads and removes its
    own keys never waits. A client id is the client's own claim, so a client could make another
    client of its tenant read an old value for up to the trust by taking its id; a client of a
    tenant can change that tenant's values at will anyway, and no other tenant is affected.

A new master (restart or failover)
    Knows no `read_at`, and a client of the former master may still reuse what that master
    named: through a node (tcp) only until the node mounts at the new master (it then refuses
    older epochs' grants, before it reports the objects the new master will serve), but over
    shm the client copies out of its own mapping with no node in the way. That master answered
    before this one started, so every such reuse ends by `started + trust_s`: until then every
    change waits for that (`floor`). A client that reaches a restarted master within its
    first `read_trust_s` sees its changes wait up to that long; nothing else does.

Costs
    A remove or overwrite of a key read within `read_trust_s` waits the rest of it (at most
    that long; a KV cache's keys are named by their content and rarely change). The master's
    work is one dict operation per dropped version read lately, one per change. 0 turns read
    trust off (clients then ask every time).
"""

from __future__ import annotations

from collections import OrderedDict

from cellar.master.state.records import Obj

__all__ = ["SHARED_READERS", "ReadTrust", "read_by"]

SHARED_READERS = "\0shared"  # Obj.reader when several clients read it within the trust


def read_by(obj: Obj, client_id: str, now: float, trust_s: float) -> None:
    """`obj` is named to `client_id` now, with read grants (a GetReplicas, or a
    PutEnd's read_back): who may reuse them within the trust (`Obj.reader`), and since when
    (`Obj.read_at`; its ranges are then named for pin_ttl_s, state/read_frees.py)."""
    if obj.reader != client_id:
        obj.reader = client_id if now - obj.read_at > trust_s else SHARED_READERS
    obj.read_at = now


class ReadTrust:
    """Until when versions read lately may still be reused by clients, and how long the change
    the current request made must wait before it is acknowledged. One event loop, no lock."""

    def __init__(self, trust_s: float, started: float = 0.0) -> None:
        """`started`: when this master began serving (monotonic s; 0 for no former master)."""
        if trust_s < 0:
            raise ValueError("trust_s must be >= 0")
        self.trust_s = trust_s
        # a former master's trust ends by then (module docstring)
        self.floor = started + trust_s if started and trust_s else 0.0
        self.settle_until = 0.0  # the current request's changes are acknowledged after this
        # (tenant, key) -> (until when a version of it that left service may still be read, by
        # whom: Obj.reader); in the order remembered (the oldest ends first, give or take
        # trust_s)
        self._ends: OrderedDict[tuple[str, str], tuple[float, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ends)

    def dropped(self, tenant_name: str, key: str, read_at: float, reader: str,
                now: float) -> None:
        """A version of `key` last named by GetReplicas at `read_at` (0: never), for `reader`
        (Obj.reader), left service."""
        if not read_at or not self.trust_s:
            return
        end = read_at + self.trust_s
        if end <= now:
            return
        name = (tenant_name, key)
        earlier = self._ends.pop(name, None)
        if earlier is not None and earlier[0] > now:
            end = max(end, earlier[0])
            if earlier[1] != reader:
                reader = SHARED_READERS
        self._ends[name] = (end, reader)
        self._prune(now)

    def changed(self, tenant_name: str, key: str, now: float, client_id: str = "") -> None:
        """`key` was removed or got a new version at `client_id`'s request: the current
        request's reply waits until no other client may reuse an older version's replicas."""
        end = 0.0
        if self._ends:
            end, reader = self._ends.pop((tenant_name, key), (0.0, ""))
            if reader == client_id and client_id:
                end = 0.0  # its only reader made the change, and forgot the key first
        if now < self.floor:
            end = max(end, self.floor)
        if end > now and end > self.settle_until:
            self.settle_until = end

    def changed_prefix(self, tenant_name: str, prefix: str, now: float,
                       client_id: str = "") -> None:
        """`changed` for every key of the tenant starting with `prefix` ("": all) whose version
        left service lately (RemovePrefix and RemoveAll: a key evicted moments before is not
        among the objects they drop, yet may still be read where it was)."""
        for tenant, key in [name for name in self._ends
                            if name[0] == tenant_name and name[1].startswith(prefix)]:
            self.changed(tenant, key, now, client_id)

    def take(self) -> float:
        """The current request's settle time (monotonic s, 0: none), cleared for the next one."""
        until, self.settle_until = self.settle_until, 0.0
        return until

    def _prune(self, now: float) -> None:
        ends = self._ends
        while ends:
            name, (end, _reader) = next(iter(ends.items()))
            if end > now:
                return
            del ends[name]
