"""Leader election for masters under an etcd lease, with fencing on the master's own clock.

How it works
    Each master holds one etcd lease (`lease_ttl_s`) and keeps it alive every
    `lease_ttl_s / KEEPALIVES_PER_TTL`. It registers itself under `masters/<id>` on that lease.
    To lead, it runs one transaction: "if `leader` does not exist and `epoch` is still at the
    version I read, put `leader` = my record (on my lease) and `epoch` = max(last + 1, wall
    ms)". Exactly one master wins; the epoch grows with every new leader. The others watch
    `leader` (plus a periodic re-read, in case a watch stalls) and try again when it vanishes,
    which etcd does when the leader's lease lapses or the leader resigns.

Fencing (why the deadline is computed this way)
    The leader may serve only while `holds_lease()`: its monotonic clock is before the last
    successful keep-alive's *send* time + the TTL etcd granted, minus a margin. etcd counts
    the TTL from when it *received* that keep-alive, which is later, so this leader stops
    serving before etcd can expire its lease and let anyone else win: two masters never both
    accept writes, even if this one is partitioned from etcd or frozen (SIGSTOP keeps the
    monotonic clock running, so a thawed leader finds its deadline passed at once). The
    owner checks `holds_lease()` on every request, not only when this loop wakes up.

While etcd is down
    The leader keeps serving until its deadline and no one can be elected (elections need
    etcd). A lapsed lease deposes the leader (`on_deposed`); a new session grants a new lease
    and campaigns again once etcd answers.

Callbacks run on the caller's event loop, synchronously, between two awaits:
    on_elected(epoch)       this master now leads under `epoch`
    on_deposed(reason)      it no longer does (lease lost or closing); stop serving at once
    on_leader(record|None)  the leader this master last saw (for redirects and status)
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Any

from cellar.coord.etcd_tls import EtcdTls
from cellar.coord.target import EtcdTarget, LeaderRecord, decode_node_ids, encode_node_ids

log = logging.getLogger("cellar.coord")

KEEPALIVES_PER_TTL = 6        # a keep-alive every TTL/6: a few may be lost before a lapse
RECHECK_INTERVAL_S = 1.0      # a standby re-reads the leader key this often besides watching
MIN_LEASE_TTL_S = 2           # etcd refuses shorter leases (about 1.5 x its election timeout)
MAX_LEASE_TTL_S = 60
SESSION_BACKOFF_S = (0.1, 2.0)
WATCH_BACKOFF_S = (0.1, 1.0)  # a cut leader watch is opened again after this (doubling)


def fence_margin_s(ttl_s: float) -> float:
    """Time the leader gives up before its lease could lapse in etcd (clock rate error, etcd's
    lease checker running early): a tenth of the TTL, at most half a second."""
    return min(0.5, ttl_s / 10)


class LeaseLost(Exception):
    pass


class LeaderElection:
    def __init__(
        self,
        target: EtcdTarget,
        me: LeaderRecord,
        *,
        lease_ttl_s: int,
        etcd_timeout_s: float,
        on_elected: Callable[[int], None],
        on_deposed: Callable[[str], None],
        on_leader: Callable[[LeaderRecord | None], None],
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        if not MIN_LEASE_TTL_S <= lease_ttl_s <= MAX_LEASE_TTL_S:
            raise ValueError(f"lease_ttl_s must be in [{MIN_LEASE_TTL_S}, {MAX_LEASE_TTL_S}]")
        self.target = target
        self.me = me
        self.lease_ttl_s = lease_ttl_s
        self.etcd_timeout_s = etcd_timeout_s
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._on_leader = on_leader
        self._monotonic = monotonic
        self._wall_ms = wall_ms
        self.is_leader = False
        self.epoch = 0
        self.elections_won = 0
        self.etcd_reachable = False
        self.lease_id = 0
        self._ended_lease_id = 0      # the lease of the last session, revoked by the next one
        self.record: LeaderRecord | None = None  # ours, while we lead
        self.expected_nodes: frozenset[str] | None = None  # the previous leader's, at takeover
        self.removal_values: list[bytes] = []  # the removal log's values, read at takeover
        # the tenant log's (key, value) pairs, read at takeover (master/serving/tenant_log.py),
        # and the token log's (master/serving/token_log.py)
        self.tenant_values: list[tuple[bytes, bytes]] = []
        self.token_values: list[tuple[bytes, bytes]] = []
        self._deadline = 0.0          # monotonic: the lease is surely valid until then
        self._client: Any = None
        self._changed = asyncio.Event()
        self._sessions = 0  # sessions opened so far (the endpoint a named list's next one uses)
        self._state = ""

    # ---- what the owner asks -------------------------------------------------------------

    def holds_lease(self) -> bool:
        """True while this master leads and its lease is surely still valid in etcd."""
        return self.is_leader and self._monotonic() < self._deadline

    async def _read_removals(self, kv: Any) -> list[bytes]:
        """Every value under the removal log's prefix, in key order, read in pages."""
        return [value for _key, value in await self._read_prefix(kv, self.target.removals_prefix)]

    async def _read_prefix(self, kv: Any, prefix: str) -> list[tuple[bytes, bytes]]:
        """Every (key, value) under `prefix`, in key order, read in pages."""
        from etcd3aio import SortOrder, SortTarget  # as Etcd3Client: only where etcd is used

        values: list[tuple[bytes, bytes]] = []
        start: str | bytes = prefix
        end = _prefix_end(prefix)
        limit = 0  # first the whole log in one reply, as always; pages only if it is too large
        while True:
            try:
                page = await kv.get(start, range_end=end, limit=limit,
                                    sort_order=SortOrder.ASCEND, sort_target=SortTarget.KEY,
                                    timeout=self.etcd_timeout_s)
            except Exception as exc:
                if limit != 1 and _too_large(exc):  # over the receive limit: smaller pages
                    limit = REMOVAL_LOG_PAGE_KEYS if limit == 0 else limit // 2
                    continue
                raise
            values += [(bytes(item.key), bytes(item.value)) for item in page.kvs]
            if not page.more or not page.kvs:
                return values
            start = bytes(page.kvs[-1].key) + b"\0"  # the next key after the last one read

    def lease_remaining_s(self) -> float:
        return max(0.0, self._deadline - self._monotonic()) if self.is_leader else 0.0

    # ---- the loop ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        backoff_s = SESSION_BACKOFF_S[0]
        while not stop.is_set():
            try:
                await self._session(stop)
                backoff_s = SESSION_BACKOFF_S[0]
            except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - see below
                # etcd errors of every kind end the session, and so does grpc.aio's
                # CancelledError for an RPC that etcd cancelled (it restarted): only the
                # cancellation of this task itself may end the campaign, or a master would
                # silently never campaign again.
                if _cancelled_by_owner():
                    raise
                self.etcd_reachable = False
                self._log_state("etcd down", logging.WARNING,
                                "etcd %s unreachable or failing (%s); retrying",
                                ",".join(self.target.endpoints), _describe(exc))
            finally:
                await self._close_client()
            if self.is_leader:
                # A session only ends once its lease cannot be renewed: stop now rather than
                # wait for the deadline, since a new session means a new lease.
                self._depose("lost the etcd session")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff_s)
            backoff_s = min(backoff_s * 2, SESSION_BACKOFF_S[1])

    async def resign(self) -> None:
        """Clean shutdown: revoke the lease, which deletes `leader` (if ours) and `masters/<id>`
        at once, so a standby takes over without waiting for the TTL."""
        if self.is_leader:
            self._depose("shutting down")
        client, lease_id = self._client, self.lease_id
        if client is None or not lease_id:
            return
        with contextlib.suppress(Exception):
            await client.lease.revoke(lease_id, timeout=self.etcd_timeout_s, max_attempts=1)
            log.info("resigned: revoked lease %x", lease_id)

    async def _session(self, stop: asyncio.Event) -> None:
        client = _etcd_client(self.target.endpoints, self._sessions, EtcdTls.from_env())
        self._sessions += 1  # endpoints given by name: the next session tries the next one
        await client.connect()
        self._client = client
        if self._ended_lease_id:
            # A session ends because its lease could not be renewed, yet etcd may still hold it
            # (etcd renews every lease when it restarts) and with it our old `leader` key: drop
            # it now so that an election need not wait a whole TTL. We stopped serving already.
            ended, self._ended_lease_id = self._ended_lease_id, 0
            with contextlib.suppress(Exception):
                await client.lease.revoke(ended, timeout=self.etcd_timeout_s, max_attempts=1)
                log.info("revoked the lease %x of the previous etcd session", ended)
        sent = self._monotonic()
        grant = await client.lease.grant(self.lease_ttl_s, timeout=self.etcd_timeout_s)
        if grant.TTL <= 0:
            raise LeaseLost(f"etcd granted a lease of {grant.TTL} s")
        self.lease_id = grant.ID
        self._deadline = sent + grant.TTL - fence_margin_s(grant.TTL)
        await client.kv.put(self.target.masters_prefix + self.me.master_id, self.me.to_json(),
                            lease=grant.ID, timeout=self.etcd_timeout_s)
        self.etcd_reachable = True
        self._log_state("session", logging.INFO, "etcd session open (lease %x, ttl %d s)",
                        grant.ID, grant.TTL)
        keepalive = asyncio.create_task(self._keep_alive(client, grant.ID, grant.TTL))
        watch = asyncio.create_task(self._watch_leader(client))
        stopping = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                if keepalive.done():
                    keepalive.result()  # raises why the lease ended
                    raise LeaseLost("keep-alive ended")
                if not self.is_leader:
                    await self._campaign(client, grant.ID)
                self._changed.clear()
                waiters = {keepalive, stopping}
                if not self.is_leader:
                    waiters.add(asyncio.create_task(self._changed.wait()))
                done, pending = await asyncio.wait(
                    waiters, timeout=RECHECK_INTERVAL_S, return_when=asyncio.FIRST_COMPLETED)
                for task in pending - {keepalive, stopping}:
                    task.cancel()
        finally:
            for task in (keepalive, watch, stopping):
                task.cancel()
            # Bounded: a task stuck in the etcd client must not stall the next session (a
            # standby that never campaigns again would leave the cluster without a leader).
            _, stuck = await asyncio.wait({keepalive, watch, stopping}, timeout=self.etcd_timeout_s)
            if stuck:
                log.warning("%d etcd task(s) did not stop within %.3g s; abandoned", len(stuck),
                            self.etcd_timeout_s)
            if stop.is_set():
                await self.resign()

    async def _campaign(self, client: Any, lease_id: int) -> None:
        kv = client.kv
        current = await kv.get(self.target.leader_key, timeout=self.etcd_timeout_s)
        if current.kvs:
            self._see_leader(current.kvs[0].value)
            return
        last = await kv.get(self.target.epoch_key, timeout=self.etcd_timeout_s)
        last_epoch, version = 0, 0
        if last.kvs:
            version = last.kvs[0].version
            with contextlib.suppress(ValueError):
                last_epoch = int(last.kvs[0].value)
        epoch = max(last_epoch + 1, self._wall_ms())
        record = LeaderRecord(self.me.master_id, self.me.address, self.me.http, epoch)
        reply = await kv.txn(
            compare=[kv.txn_compare_create_revision(self.target.leader_key, 0),
                     kv.txn_compare_version(self.target.epoch_key, version)],
            success=[kv.txn_op_put(self.target.leader_key, record.to_json(), lease=lease_id),
                     kv.txn_op_put(self.target.epoch_key, str(epoch))],
            failure=[kv.txn_op_get(self.target.leader_key)],
            timeout=self.etcd_timeout_s,
        )
        if not reply.succeeded:
            for response in reply.responses:
                for item in response.response_range.kvs:
                    self._see_leader(item.value)
            return
        if self._monotonic() >= self._deadline:
            # Won, but the lease may already be near its end (a slow transaction): give it up
            # rather than serve on a lease we cannot vouch for; the keep-alive decides.
            log.warning("won the election with no lease time left; resigning")
            await client.lease.revoke(lease_id, timeout=self.etcd_timeout_s, max_attempts=1)
            raise LeaseLost("no lease time left after winning")
        nodes = await kv.get(self.target.nodes_key, timeout=self.etcd_timeout_s)
        self.expected_nodes = decode_node_ids(nodes.kvs[0].value) if nodes.kvs else None
        # The removal log (cellar.master.serving.removal_log), read before this master serves
        # anything: no report may be adopted before the removes acknowledged by earlier leaders.
        self.removal_values = await self._read_removals(kv)
        self.tenant_values = await self._read_prefix(kv, self.target.tenants_prefix)
        self.token_values = await self._read_prefix(kv, self.target.tokens_prefix)
        self.record = record
        self.is_leader = True
        self.epoch = epoch
        self.elections_won += 1
        self._state = "leader"
        log.info("elected leader of cluster %r with epoch %d (lease %x, %.2f s of lease left)",
                 self.target.cluster, epoch, lease_id, self.lease_remaining_s())
        self._on_leader(record)
        self._on_elected(epoch)

    async def publish_nodes(self, node_ids: frozenset[str]) -> bool:
        """Record the mounted nodes for the next leader; only while our record is the leader's
        (a deposed leader's late write fails the comparison). False when it was not written."""
        return await self.write_as_leader({self.target.nodes_key: encode_node_ids(node_ids)})

    async def write_as_leader(self, puts: dict[str, bytes], delete_range: tuple[str, str] | None = None
                              ) -> bool:
        """Put `puts` (and delete the keys in [start, end) of `delete_range`) in one
        transaction, only while our record is the leader's. False when nothing was written."""
        client, record = self._client, self.record
        if client is None or record is None or not self.holds_lease():
            return False
        kv = client.kv
        ops = [kv.txn_op_put(key, value) for key, value in puts.items()]
        if delete_range is not None:
            ops.append(kv.txn_op_delete(delete_range[0], range_end=delete_range[1]))
        reply = await kv.txn(
            compare=[kv.txn_compare_value(self.target.leader_key, record.to_json())],
            success=ops, timeout=self.etcd_timeout_s,
        )
        return bool(reply.succeeded)

    async def _keep_alive(self, client: Any, lease_id: int, ttl_s: int) -> None:
        """Renew the lease; return (ending the session) once it can no longer be renewed."""
        interval_s = max(0.2, ttl_s / KEEPALIVES_PER_TTL)
        while True:
            await asyncio.sleep(interval_s)
            sent = self._monotonic()
            try:
                granted = await asyncio.wait_for(self._keep_alive_once(client, lease_id),
                                                 timeout=min(self.etcd_timeout_s, interval_s * 2))
            except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - as in run()
                if _cancelled_by_owner():
                    raise
                self.etcd_reachable = False
                if self._monotonic() >= self._deadline:
                    raise LeaseLost(f"lease {lease_id:x} not renewed in time ({_describe(exc)})") from None
                self._log_state("keepalive failing", logging.WARNING,
                                "lease keep-alive failing (%s); %.2f s of lease left",
                                _describe(exc), max(0.0, self._deadline - self._monotonic()))
                continue
            if granted <= 0:
                raise LeaseLost(f"lease {lease_id:x} expired in etcd")
            self.etcd_reachable = True
            self._deadline = sent + granted - fence_margin_s(granted)
            if self._state == "keepalive failing":
                self._log_state("leader" if self.is_leader else "standby", logging.INFO,
                                "lease keep-alive works again")

    @staticmethod
    async def _keep_alive_once(client: Any, lease_id: int) -> int:
        call = client.lease.keep_alive(lease_id)
        try:
            response = await call.read()
        finally:
            call.cancel()
        if response is None or not hasattr(response, "TTL"):
            raise LeaseLost("keep-alive stream closed")
        return int(response.TTL)

    async def _watch_leader(self, client: Any) -> None:
        """Set `_changed` at every answer of the leader key's watch (its creation too, so the
        campaign reads the key again after each stream opened: a change between two streams is
        not lost), until cancelled (the session's end); a stream etcd cut is opened again after
        WATCH_BACKOFF_S.

        A watch stream of our own, written to, not etcd3aio's `watch`: that one feeds its
        request from a generator that then waits forever, which grpc.aio runs in a task it
        cancels only while the call still runs. Every stream etcd cut (an outage, a restart)
        left such a task behind, destroyed pending when the session ended and logged as
        asyncio ERRORs ("Task was destroyed but it is pending", "aclose(): asynchronous
        generator is already running"). The campaign re-reads the key every
        RECHECK_INTERVAL_S anyway, so a watch that is down delays nothing by more."""
        import grpc.aio
        from etcd3aio._protobuf import WatchCreateRequest, WatchRequest

        watch = client.watch
        request = WatchRequest(create_request=WatchCreateRequest(
            key=self.target.leader_key.encode()))
        backoff_s = WATCH_BACKOFF_S[0]
        while True:
            call = watch._stub.Watch(metadata=watch._metadata or None)
            try:
                await call.write(request)
                while await call.read() is not grpc.aio.EOF:  # type: ignore[attr-defined]
                    self._changed.set()
                    backoff_s = WATCH_BACKOFF_S[0]
            except Exception as exc:  # noqa: BLE001 - etcd away: the session's keep-alive decides
                log.debug("leader watch ended (%s); watching again", _describe(exc))
            finally:
                call.cancel()
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, WATCH_BACKOFF_S[1])

    def _see_leader(self, raw: bytes) -> None:
        try:
            record = LeaderRecord.from_json(raw)
        except ValueError as exc:
            log.warning("malformed leader record in etcd (%s); waiting for it to lapse", exc)
            return
        self._log_state(f"standby:{record.master_id}:{record.epoch}", logging.INFO,
                        "standby: leader is %s at %s (epoch %d)", record.master_id,
                        record.address, record.epoch)
        self._on_leader(record)

    def _depose(self, reason: str) -> None:
        if not self.is_leader:
            return
        self.is_leader = False
        self.record = None
        self._deadline = 0.0
        self._state = "deposed"
        log.warning("no longer leader (epoch %d): %s", self.epoch, reason)
        self._on_leader(None)
        self._on_deposed(reason)

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if self.lease_id:
            self._ended_lease_id = self.lease_id
        self.lease_id = 0
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), self.etcd_timeout_s)

    def _log_state(self, state: str, level: int, message: str, *args: object) -> None:
        if state != self._state:
            self._state = state
            log.log(level, message, *args)


# The removal log is read in pages that shrink on demand: one range reply must stay under
# gRPC's default 4 MiB receive limit (a single read of a grown log failed with
# RESOURCE_EXHAUSTED and no master could win), yet most values are small (one per request batch),
# so a page of a few keys would take thousands of round trips (a 30 s election). The first read
# asks for the whole log; only if that reply is too large, pages of REMOVAL_LOG_PAGE_KEYS, halved
# on each further RESOURCE_EXHAUSTED (values are at most 512 KiB each,
# removal_log.MAX_ETCD_VALUE_BYTES, so 8 always fit).
REMOVAL_LOG_PAGE_KEYS = 1024


def _too_large(exc: BaseException) -> bool:
    return "RESOURCE_EXHAUSTED" in repr(exc) or "larger than max" in str(exc)


def _prefix_end(prefix: str) -> bytes:
    """The exclusive end of the key range under `prefix` (its last byte plus one)."""
    raw = prefix.encode()
    return raw[:-1] + bytes([raw[-1] + 1])


def _cancelled_by_owner() -> bool:
    """Whether the running task itself is being cancelled (not an RPC inside it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _etcd_client(endpoints: tuple[str, ...], turn: int, tls: EtcdTls | None) -> Any:
    """An etcd3aio client for one session. etcd3aio writes every target as `ipv4:HOST:PORT,...`
    (round-robin over the list), which gRPC refuses for a host name: a master given
    `--etcd etcd-0.etcd:2379` (the Helm chart's Services, compose's `etcd:2379`) never opened a
    session. IPv4 literals keep that list; otherwise each session dials one endpoint, the
    `turn`-th, through gRPC's DNS resolver (TLS then verifies that name), and a session that
    fails moves to the next."""
    from etcd3aio import Etcd3Client

    args = tls.client_args() if tls is not None else {}
    if all(_ipv4_endpoint(e) for e in endpoints):
        return Etcd3Client(list(endpoints), rpc_max_attempts=1, **args)
    endpoint = endpoints[turn % len(endpoints)]
    client: Any = Etcd3Client([endpoint], rpc_max_attempts=1, **args)
    client._manager.target = f"dns:///{endpoint}"  # etcd3aio's private manager (pinned)
    return client


def _ipv4_endpoint(endpoint: str) -> bool:
    """Whether `endpoint`'s host is an IPv4 address written as gRPC's ipv4: parser takes it."""
    host = endpoint.rpartition(":")[0]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.version == 4 and str(address) == host
