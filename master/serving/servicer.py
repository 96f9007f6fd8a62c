"""The gRPC face of the master: a thin grpc.aio adapter over `MasterService`.

Owns only translation: protobuf request -> plain call -> protobuf reply, and whole-request
failures -> gRPC status codes with a message (INVALID_ARGUMENT for a batch over the limit, an
unknown tenant, a malformed message such as a non-UTF-8 string). It also counts requests, keys,
failures and handling time per RPC for /metrics.

Who may call what is decided before any body runs, in one place (`cellar.master.serving.auth`): the
gRPC `AuthInterceptor` here and the same `Authorizer.check` in `dispatch` for the fast line.
Domain errors (`RequestRejected`, `AuthRefused`) become status codes through one table
(`rejection`) for both lines.

Requests are parsed by our own deserializer so that undecodable bytes become INVALID_ARGUMENT
rather than grpc's generic INTERNAL. Handlers are coroutines that never await in the middle
of a service call, so each request mutates metadata atomically on the one event loop. This
module holds no state of its own besides the counters and never touches payload bytes.

ClusterStatus only translates `cellar.master.serving.cluster_summary.summarize`, which /api/v1/status reports too.

`dispatch` runs the same bodies for the master's metadata fast line (`cellar.master.serving.fastrpc`),
whose port ClusterStatus advertises in its trailing metadata.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from cellar.coord.redirect import LEADER_METADATA
from cellar.master.lookup import lookup
from cellar.master.repair import CopyOrder
from cellar.master.replies import GetResult
from cellar.master.service import GrantedReplica, MasterService, RequestRejected
from cellar.master.serving.auth import (
    CURRENT_IDENTITY,
    METHOD_POLICY,
    NODE_RPC,
    Authorizer,
    AuthRefused,
)
from cellar.master.serving.cluster_summary import summarize
from cellar.master.serving.fastrpc import FAST_PORT_METADATA
from cellar.master.serving.kv_stream import METHOD as KV_WATCH
from cellar.master.serving.kv_stream import watch_handler
from cellar.master.serving.leadership import DurableWork, Leadership, LeadershipLost
from cellar.master.serving.metrics import RPC_METRIC_NAMES, RpcStats
from cellar.master.serving.request_memory import RequestMemory, request_tag
from cellar.proto import cellar_pb2 as pb

SERVICE_NAME = "cellar.v1.Master"
log = logging.getLogger("cellar.master")


# The one table of domain errors -> gRPC status codes, for gRPC and the fast line alike. Both
# domain errors name their code (`code`, a grpc.StatusCode name) and a `message`.
DOMAIN_ERRORS: tuple[type[Exception], ...] = (RequestRejected, AuthRefused)
_CODES = {code.name: code for code in grpc.StatusCode}


def rejection(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and message a domain error is answered with."""
    code = _CODES.get(getattr(exc, "code", ""), grpc.StatusCode.INTERNAL)
    return code, str(getattr(exc, "message", exc))


def _token_id() -> str:
    """The token id of the call being served ('' without an identity): what request ids are
    scoped by (request_memory.py)."""
    identity = CURRENT_IDENTITY.get()
    return identity.token_id if identity is not None else ""


class Malformed:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _parser(cls: Any) -> Callable[[bytes], Any]:
    from_string = cls.FromString

    def parse(data: bytes) -> Any:
        try:
            return from_string(data)
        except DecodeError as exc:
            return Malformed(str(exc))

    return parse


def _add_replicas(target: Any, replicas: list[GrantedReplica]) -> None:
    """Append replicas to a repeated Replica field, building in place (no nested copies)."""
    add = target.add
    for r in replicas:
        rep = add(node_id=r.node_id, segment_id=r.segment_id, offset=r.offset, length=r.length)
        if r.claim:
            rep.claim = True
        g = rep.grant
        g.op = r.op
        g.alloc_id = r.alloc_id
        g.epoch = r.epoch
        g.expiry_ms = r.expiry_ms
        g.key_tag = r.key_tag
        g.mac = r.mac


def _add_get_results(target: Any, results: list[GetResult]) -> int:
    """Append GetReplicas-style results to a repeated GetResult field; the failures' count."""
    add = target.add
    failures = 0
    for r in results:
        if r.status:
            failures += 1
            add(status=r.status, message=r.message)  # type: ignore[arg-type]
        else:
            _add_replicas(add(size_bytes=r.size_bytes, checksum=r.checksum, pin_id=r.pin_id).replicas,
                          r.replicas)
    return failures


def _add_ahead(target: Any, granted: list[Any]) -> None:
    """Put-ahead allocations (master/put_ahead.py) into a reply's `ahead` field."""
    add = target.add
    for r in granted:
        _add_replicas(add(put_id=r.put_id).replicas, r.replicas)


def _grant_pb(r: GrantedReplica) -> pb.Grant:
    return pb.Grant(op=r.op, alloc_id=r.alloc_id, epoch=r.epoch, expiry_ms=r.expiry_ms,
                    key_tag=r.key_tag, mac=r.mac)


def copy_tasks(orders: list[CopyOrder]) -> list[pb.CopyTask]:
    """Copy orders (master/repair.py) as the proto a target node receives in its heartbeat."""
    out = []
    for o in orders:
        address = next((e.address for e in o.source_segment.info.endpoints if e.transport == "tcp"), "")
        out.append(pb.CopyTask(
            alloc_id=o.target.alloc_id, tenant=o.tenant, key=o.key, length=o.length,
            checksum=o.checksum, source_address=address, source_node_id=o.source.node_id,
            source_grant=_grant_pb(o.source), source_segment_id=o.source.segment_id,
            source_offset=o.source.offset, target_grant=_grant_pb(o.target),
            target_segment_id=o.target.segment_id, target_offset=o.target.offset,
            value_alloc_id=o.value_alloc_id))
    return out


def _trusted_on_host() -> bool:
    """Whether the caller may see shm endpoints: its token says shm (or it is an admin)."""
    identity = CURRENT_IDENTITY.get()
    return identity is not None and (identity.shm or identity.admin)


def _segment_infos(segments: list[Any]) -> list[Any]:
    """The segments table of a reply: with shm endpoints only for an identity trusted on the
    nodes' hosts; everyone else is shown tcp (and rdma) only."""
    if _trusted_on_host():
        return [s.info for s in segments]
    return [s.untrusted_info() for s in segments]


class MasterServicer:
    """Builds the method handlers for `cellar.v1.Master` over one MasterService."""

    def __init__(self, leadership: Leadership, authorizer: Authorizer) -> None:
        self.leadership = leadership
        self.authorizer = authorizer
        self.stats: dict[str, RpcStats] = {name: RpcStats() for name in RPC_METRIC_NAMES}
        self.fast_port = 0  # the fast line's port once it listens (cellar.master.serving.fastrpc)
        config = leadership.config
        self._read_trust_ms = int(config.read_trust_s * 1000)  # in every GetReplicas reply
        # replies of mutating calls by request id, for both lines (request_memory.py)
        self.requests = RequestMemory(config.request_id_memory_entries,
                                      config.request_id_memory_s, config.request_id_memory_bytes)
        self._behind: set[asyncio.Task[str]] = set()  # node calls' bounds being written

    @property
    def service(self) -> MasterService:
        """The live service: a new one after every election (cellar.master.serving.leadership)."""
        return self.leadership.service

    def _header(self) -> pb.ReplyHeader:
        epoch, wall_ms = self.service.header()
        return pb.ReplyHeader(epoch=epoch, master_time_ms=wall_ms)

    # ---------------------------------------------------------------- RPCs (sync bodies)

    def PutStart(self, req: pb.PutStartRequest, stats: RpcStats) -> pb.PutStartReply:
        h = req.header
        identity = CURRENT_IDENTITY.get()
        request = ((identity.token_id if identity is not None else "", h.client_id, h.request_id)
                   if h.request_id else None)
        outcome = self.service.put_start(h.tenant, h.client_id, req.items,
                                         may_commit=_trusted_on_host(), request=request,
                                         ahead=req.ahead if req.HasField("ahead") else None)
        reply = pb.PutStartReply(header=self._header(), segments=_segment_infos(outcome.segments))
        add = reply.results.add
        failures = 0
        for r in outcome.results:
            if r.status:
                failures += 1
                add(status=r.status, message=r.message)  # type: ignore[arg-type]
            else:
                _add_replicas(add(put_id=r.put_id).replicas, r.replicas)
        _add_ahead(reply.ahead, outcome.ahead)
        stats.keys += len(outcome.results)
        stats.key_failures += failures
        return reply

    def GetReplicas(self, req: pb.GetReplicasRequest, stats: RpcStats) -> pb.GetReplicasReply:
        h = req.header
        outcome = self.service.get_replicas(h.tenant, h.client_id, req.keys, req.unpin_ids)
        reply = pb.GetReplicasReply(header=self._header(), segments=_segment_infos(outcome.segments),
                                    read_trust_ms=self._read_trust_ms)
        failures = _add_get_results(reply.results, outcome.results)
        stats.keys += len(outcome.results)
        stats.key_failures += failures
        return reply

    def _key_reply(self, cls: Any, results: list[tuple[int, str]], stats: RpcStats, **fields: Any) -> Any:
        """A reply of type `cls` with per-key results, built in place: an empty `add()` per OK
        key costs a third of building KeyResult messages and copying them into the reply."""
        reply = cls(header=self._header(), **fields)
        add = reply.results.add
        failures = 0
        for status, message in results:
            if status:
                failures += 1
                add(status=status, message=message)  # type: ignore[arg-type]
            else:
                add()
        stats.keys += len(results)
        stats.key_failures += failures
        return reply

    def PutEnd(self, req: pb.PutEndRequest, stats: RpcStats) -> pb.PutEndReply:
        h = req.header
        results = self.service.put_end(h.tenant, h.client_id, req.items)
        reply = self._key_reply(pb.PutEndReply, results, stats)
        segments: list[Any] = []
        if req.HasField("ahead"):
            ahead = self.service.put_ahead(h.tenant, req.ahead, may_commit=_trusted_on_host())
            _add_ahead(reply.ahead, ahead.ahead)
            segments = ahead.segments
        if req.read_back:  # client/read_backs.py
            reads = self.service.read_back(h.tenant, h.client_id, req.items, results)
            _add_get_results(reply.reads, reads.results)
            reply.read_trust_ms = self._read_trust_ms
            segments = list({seg.segment_id: seg for seg in (*segments, *reads.segments)}.values())
        if segments:
            reply.segments.extend(_segment_infos(segments))
        return reply

    def PutRevoke(self, req: pb.PutRevokeRequest, stats: RpcStats) -> pb.PutRevokeReply:
        results = self.service.put_revoke(req.header.tenant, req.header.client_id, req.items)
        return self._key_reply(pb.PutRevokeReply, results, stats)

    def Unpin(self, req: pb.UnpinRequest, stats: RpcStats) -> pb.UnpinReply:
        released = self.service.unpin(req.header.tenant, req.header.client_id, req.pin_ids)
        stats.keys += len(req.pin_ids)
        return pb.UnpinReply(header=self._header(), released=released)

    def Exists(self, req: pb.KeysRequest, stats: RpcStats) -> pb.ExistsReply:
        statuses = self.service.exists(req.header.tenant, req.keys)
        stats.keys += len(statuses)
        stats.key_failures += sum(1 for s in statuses if s and s != pb.NOT_FOUND)
        return pb.ExistsReply(header=self._header(), statuses=statuses)  # type: ignore[arg-type]

    def PrefixLen(self, req: pb.KeysRequest, stats: RpcStats) -> pb.PrefixLenReply:
        count = self.service.prefix_len(req.header.tenant, req.keys)
        stats.keys += len(req.keys)
        return pb.PrefixLenReply(header=self._header(), prefix_len=count)

    def Lookup(self, req: pb.KeysRequest, stats: RpcStats) -> pb.LookupReply:
        outcome = lookup(self.service, req.header.tenant, req.keys)
        stats.keys += len(req.keys)
        return pb.LookupReply(header=self._header(), prefix_len=outcome.prefix_len,
                              prefix_bytes=outcome.prefix_bytes,
                              tiers=[pb.TierRun(tier=t, keys=k, bytes=b) for t, k, b in outcome.tiers])

    def Remove(self, req: pb.KeysRequest, stats: RpcStats) -> pb.RemoveReply:
        results = self.service.remove(req.header.tenant, req.keys,
                                      by=request_tag(req, _token_id()),
                                      client_id=req.header.client_id)
        return self._key_reply(pb.RemoveReply, results, stats)

    def RemovePrefix(self, req: pb.RemovePrefixRequest, stats: RpcStats) -> pb.RemoveCountReply:
        removed = self.service.remove_prefix(req.header.tenant, req.prefix, req.header.client_id)
        return pb.RemoveCountReply(header=self._header(), removed=removed)

    def RemoveAll(self, req: pb.RemoveAllRequest, stats: RpcStats) -> pb.RemoveCountReply:
        hub = self.leadership.kv_events
        if hub is None:
            removed = self.service.remove_all(req.header.tenant, req.header.client_id)
        else:  # one AllBlocksCleared rather than a BlockRemoved per object
            with hub.clearing(self.service.tenant(req.header.tenant).name):
                removed = self.service.remove_all(req.header.tenant, req.header.client_id)
        return pb.RemoveCountReply(header=self._header(), removed=removed)

    def ListKeys(self, req: pb.ListKeysRequest, stats: RpcStats) -> pb.ListKeysReply:
        keys, more = self.service.list_keys(req.header.tenant, req.prefix, req.start_after,
                                            req.limit)
        stats.keys += len(keys)
        return pb.ListKeysReply(header=self._header(), keys=keys, more=more)

    def MountSegment(self, req: pb.MountSegmentRequest, stats: RpcStats) -> pb.MountSegmentReply:
        outcome = self.service.mount_segment(
            req.node_id, req.incarnation, req.segments, report_follows=req.report_follows,
            previous_epoch=req.previous_epoch,
        )
        return self._key_reply(
            pb.MountSegmentReply, outcome.results, stats,
            heartbeat_interval_ms=outcome.heartbeat_interval_ms,
            write_grant_ttl_ms=outcome.write_grant_ttl_ms,
            read_grant_ttl_ms=outcome.read_grant_ttl_ms,
        )

    def ReportObjects(self, req: pb.ReportObjectsRequest, stats: RpcStats) -> pb.ReportObjectsReply:
        outcome = self.service.report_objects(
            req.node_id, req.incarnation, req.segment_id, req.entries, req.last
        )
        stats.keys += len(req.entries)
        stats.key_failures += len(outcome.refused)
        return pb.ReportObjectsReply(
            header=self._header(), status=outcome.status,  # type: ignore[arg-type]
            message=outcome.message, refused_alloc_ids=outcome.refused, accepted=outcome.accepted,
        )

    def UnmountSegment(self, req: pb.UnmountSegmentRequest, stats: RpcStats) -> pb.UnmountSegmentReply:
        results = self.service.unmount_segment(req.node_id, req.segment_ids)
        return self._key_reply(pb.UnmountSegmentReply, results, stats)

    def Heartbeat(self, req: pb.HeartbeatRequest, stats: RpcStats) -> pb.HeartbeatReply:
        outcome = self.service.heartbeat(req.node_id, req.incarnation, req.freed_ack_seq, req.lost,
                                         req.moved)
        FreedRange = pb.FreedRange
        freed = [
            FreedRange(segment_id=seg, alloc_id=alloc, offset=off, length=length)
            for (_seq, seg, alloc, off, length) in outcome.freed
        ]
        copies = [] if outcome.remount else copy_tasks(
            self.service.repair.on_heartbeat(req.node_id, req.incarnation, req.copied))
        return pb.HeartbeatReply(
            header=self._header(), remount=outcome.remount, freed=freed, freed_seq=outcome.freed_seq,
            copies=copies,
            moves=[tier_move(m, self.service.clock.monotonic()) for m in outcome.moves],
            engine_hashes=[pb.EngineHashNote(segment_id=seg, alloc_id=alloc, engine_hash=value)
                           for seg, alloc, value in outcome.engine_hashes],
            soft_pins=[pb.SoftPinNote(segment_id=seg, alloc_id=alloc, until_ms=until)
                       for seg, alloc, until in outcome.soft_pins],
        )

    def ClusterStatus(self, req: pb.ClusterStatusRequest, stats: RpcStats) -> pb.ClusterStatusReply:
        summary = summarize(self.leadership, caller_tenant=req.header.tenant,
                            trusted=_trusted_on_host())
        header = pb.ReplyHeader(epoch=summary.epoch, master_time_ms=summary.master_time_ms)
        return pb.ClusterStatusReply(
            header=header, role=summary.role, leader_address=summary.leader_address,
            max_key_bytes=summary.max_key_bytes, max_batch_keys=summary.max_batch_keys,
            max_list_keys=summary.max_list_keys,
            segments=[pb.SegmentStatus(info=s.info, state=s.state,  # type: ignore[arg-type]
                                       used_bytes=s.used_bytes, object_count=s.object_count)
                      for s in summary.segments],
            tenants=[pb.TenantStatus(name=t.name, used_bytes=t.used_bytes, quota_bytes=t.quota_bytes,
                                     object_count=t.object_count, quota_objects=t.quota_objects,
                                     quarantined_bytes=t.quarantined_bytes)
                     for t in summary.tenants],
            object_count=summary.object_count, capacity_bytes=summary.capacity_bytes,
            used_bytes=summary.used_bytes, max_object_bytes=summary.max_object_bytes,
            tier_stats=[pb.TierStats(tier=tier, hits=hits, read_bytes=read, write_bytes=written)
                        for tier, hits, read, written in summary.tier_stats],
            tier_moves=pb.TierMoves(**summary.tier_moves),
        )

    def _once(self, name: str, body: Callable[[Any, RpcStats], Any], request: Any,
              stats: RpcStats) -> Any:
        """`body`'s reply, or for a repeated request id the first call's (request_memory.py)."""
        memory = self.requests
        service = self.leadership.service
        memory.serve(service)
        return memory.once(name, request, _token_id(), lambda: body(request, stats),
                           service.objects.read_trust)

    # ---------------------------------------------------------------- wiring

    def _handler(
        self, name: str, body: Callable[[Any, RpcStats], Any]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        stats = self.stats[name]
        perf_counter = time.perf_counter
        advertise = name == "ClusterStatus"
        leadership = self.leadership
        serving = leadership.serving
        gated = name != "ClusterStatus"
        # A node's call acknowledges nothing to a client: the bounds it takes (most often the
        # dead writes the ticker queued for puts it timed out, which whoever asks next takes)
        # go to the removal log behind its reply. Waiting for them, a heartbeat hung as long as etcd did (SIGSTOPped for
        # 1-2 s in `cellar soak --ha`), its node took the timeout for a lost master and went
        # to etcd for the leader, and the leader found its nodes SUSPECT and refused puts for
        # want of live nodes. Its ranges stay held until the write succeeds (make_durable),
        # a failed write is carried by the next change's (Leadership._unwritten), and a
        # client's request on another connection was never held behind it anyway.
        behind = METHOD_POLICY.get(name) == NODE_RPC

        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            stats.requests += 1
            started = perf_counter()
            if gated and not serving():
                stats.failures += 1
                context.set_trailing_metadata(((LEADER_METADATA, leadership.redirect_address()),))
                await context.abort(grpc.StatusCode.UNAVAILABLE, leadership.redirect())
            if type(request) is Malformed:
                stats.failures += 1
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"malformed {name} request (strings must be valid UTF-8): {request.reason}",
                )
            try:
                reply = self._once(name, body, request, stats)
            except DOMAIN_ERRORS as exc:
                stats.failures += 1
                await context.abort(*rejection(exc))
            except Exception as exc:  # a bug: keep serving, say so loudly
                stats.failures += 1
                log.exception("%s failed", name)
                await context.abort(grpc.StatusCode.INTERNAL, f"{name}: internal error: {exc!r}")
            if leadership.durable_due(name):  # a remove or upsert: acknowledged once durable
                if behind:
                    self._write_behind(name, leadership.take_durable())
                else:
                    failure = await self.make_durable(name)
                    if failure:
                        stats.failures += 1
                        await context.abort(grpc.StatusCode.UNAVAILABLE, failure)
            stats.observe(perf_counter() - started)
            if advertise and self.fast_port and serving():
                context.set_trailing_metadata(((FAST_PORT_METADATA, str(self.fast_port)),))
            return reply

        return handle

    def _write_behind(self, name: str, work: DurableWork) -> None:
        """Make `work` durable in a task of its own (kept referenced until it ends)."""
        task = asyncio.get_running_loop().create_task(self.make_durable(name, work))
        self._behind.add(task)
        task.add_done_callback(self._behind.discard)

    async def make_durable(self, name: str, work: DurableWork | None = None) -> str:
        """Write the bounds this request queued to the removal log (removal_log.py) and wait
        out its read trust (`Leadership.make_durable`); '' when done, else why the request
        must not be acknowledged."""
        try:
            await self.leadership.make_durable(work)
        except LeadershipLost as exc:
            return f"{name}: {exc}; retry at the leader ({self.leadership.redirect()})"
        except Exception as exc:  # noqa: BLE001 - a file or etcd error: not acknowledged
            log.warning("%s: could not write the removal log: %s", name, exc)
            return f"{name}: could not make the change durable (removal log: {exc}); retry"
        return ""

    async def settle(self, name: str, code: int, out: bytes,
                     work: DurableWork) -> tuple[int, bytes]:
        """The fast line's `make_durable`: after `dispatch` (and `take_durable`, in the same
        callback), before the reply is sent."""
        failure = await self.make_durable(name, work)
        if failure:
            self.stats[name].failures += 1
            return grpc.StatusCode.UNAVAILABLE.value[0], failure.encode()
        return code, out

    def dispatch(self, name: str, data: bytes) -> tuple[int, bytes]:
        """One RPC for the fast line (`cellar.master.serving.fastrpc`): the serialized request in, the
        numeric gRPC status code and the serialized reply (or the error details) out. Same
        bodies, statistics and error mapping as the gRPC handlers."""
        parse, serialize = self._codecs[name]
        stats = self.stats[name]
        stats.requests += 1
        started = time.perf_counter()
        if not self.leadership.serving():
            stats.failures += 1
            return grpc.StatusCode.UNAVAILABLE.value[0], self.leadership.redirect().encode()
        request = parse(data)
        if type(request) is Malformed:
            stats.failures += 1
            return (grpc.StatusCode.INVALID_ARGUMENT.value[0],
                    f"malformed {name} request (strings must be valid UTF-8): "
                    f"{request.reason}".encode())
        token = None
        try:
            token = CURRENT_IDENTITY.set(self.authorizer.check(name, request))
            reply = self._once(name, getattr(self, name), request, stats)
        except DOMAIN_ERRORS as exc:
            stats.failures += 1
            code, message = rejection(exc)
            return code.value[0], message.encode()
        except Exception as exc:  # a bug: keep serving, say so loudly
            stats.failures += 1
            log.exception("%s failed", name)
            return (grpc.StatusCode.INTERNAL.value[0],
                    f"{name}: internal error: {exc!r}".encode())
        finally:
            if token is not None:
                CURRENT_IDENTITY.reset(token)
        stats.observe(time.perf_counter() - started)
        return 0, serialize(reply)

    @functools.cached_property
    def _codecs(self) -> dict[str, tuple[Callable[[bytes], Any], Callable[[Any], bytes]]]:
        return {name: (_parser(req_cls), reply_cls.SerializeToString)
                for name, (req_cls, reply_cls) in self._messages().items()}

    @staticmethod
    def _messages() -> dict[str, tuple[Any, Any]]:
        return {
            "PutStart": (pb.PutStartRequest, pb.PutStartReply),
            "PutEnd": (pb.PutEndRequest, pb.PutEndReply),
            "PutRevoke": (pb.PutRevokeRequest, pb.PutRevokeReply),
            "GetReplicas": (pb.GetReplicasRequest, pb.GetReplicasReply),
            "Unpin": (pb.UnpinRequest, pb.UnpinReply),
            "Exists": (pb.KeysRequest, pb.ExistsReply),
            "PrefixLen": (pb.KeysRequest, pb.PrefixLenReply),
            "Remove": (pb.KeysRequest, pb.RemoveReply),
            "RemovePrefix": (pb.RemovePrefixRequest, pb.RemoveCountReply),
            "RemoveAll": (pb.RemoveAllRequest, pb.RemoveCountReply),
            "ListKeys": (pb.ListKeysRequest, pb.ListKeysReply),
            "MountSegment": (pb.MountSegmentRequest, pb.MountSegmentReply),
            "UnmountSegment": (pb.UnmountSegmentRequest, pb.UnmountSegmentReply),
            "Heartbeat": (pb.HeartbeatRequest, pb.HeartbeatReply),
            "ReportObjects": (pb.ReportObjectsRequest, pb.ReportObjectsReply),
            "ClusterStatus": (pb.ClusterStatusRequest, pb.ClusterStatusReply),
            "Lookup": (pb.KeysRequest, pb.LookupReply),
        }

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        requests = self._messages()
        return {
            name: grpc.unary_unary_rpc_method_handler(
                self._handler(name, getattr(self, name)),
                request_deserializer=_parser(req_cls),
                response_serializer=reply_cls.SerializeToString,
            )
            for name, (req_cls, reply_cls) in requests.items()
        }

    def add_to_server(self, server: grpc.aio.Server) -> None:
        handlers = self.method_handlers()
        handlers[KV_WATCH] = watch_handler(self.leadership, self.authorizer, rejection)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        server.add_registered_method_handlers(SERVICE_NAME, handlers)  # type: ignore[attr-defined]


def tier_move(move: Any, now: float) -> pb.Move:
    """A state/tiers.py Move as the node reads it, with the time it has left at `now` (at
    least 1 ms: 0 would mean "not sent", and an overdue move must read as expired)."""
    src, dst = move.src, move.dst
    return pb.Move(src_segment_id=src.segment.segment_id, src_alloc_id=src.alloc_id,
                   src_offset=src.offset, length=move.obj.size,
                   dst_segment_id=dst.segment.segment_id, dst_alloc_id=dst.alloc_id,
                   dst_offset=dst.offset,
                   expires_in_ms=max(1, int((move.deadline - now) * 1000)))
