"""KV events in vLLM's wire format over a real cluster: a pyzmq subscriber decoding with
msgspec structs of vLLM's shape sees a BlockStored per put with no sequence gap, BlockRemoved
for removes and evictions, AllBlocksCleared on RemoveAll; a subscriber that missed 50 batches
gets exactly those from the replay socket; the authenticated gRPC stream shows a tenant only
its own events."""

from __future__ import annotations

import signal
import threading
from typing import Any

import grpc
import msgspec
import pytest
import zmq

import cellar
from cellar.client import PutHints
from cellar.devtools.local_cluster import LocalCluster
from cellar.devtools.ports import free_port
from cellar.master.serving.kv_events import key_hash
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc

KIB = 1 << 10
PAGE = b"p" * (256 * KIB)


# vLLM's structures (vllm/distributed/kv_events.py), as a router declares them to decode.
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODE = msgspec.msgpack.Decoder(KVEventBatch).decode


class Subscriber:
    def __init__(self, ctx: zmq.Context, address: str, topic: bytes) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.topic = topic

    def next(self, timeout_ms: int = 10_000) -> tuple[int, KVEventBatch]:
        assert self.sock.poll(timeout_ms), "no event batch arrived"
        topic, seq, payload = self.sock.recv_multipart()
        assert topic == self.topic
        return int.from_bytes(seq, "big"), DECODE(payload)

    def close(self) -> None:
        self.sock.close()


def _replay(ctx: zmq.Context, address: str, start: int, topic: bytes | None = None
            ) -> list[tuple[int, KVEventBatch]]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")] + ([topic] if topic else []))
        out = []
        while True:
            assert dealer.poll(10_000), "the replay socket did not answer"
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b""
                return out
            out.append((int.from_bytes(seq, "big"), DECODE(payload)))
    finally:
        dealer.close()


@pytest.fixture(scope="module")
def events_cluster():
    port = free_port()
    replay = free_port()
    # no background eviction (it would evict down to the low watermark after the last put,
    # at a time the test cannot know): every eviction here is a put's, so events are settled
    # once the last put has returned
    cluster = LocalCluster(2, "32MiB", master_flags={
        "eviction_high_watermark": 1.0, "eviction_low_watermark": 1.0,
        "kv_events_bind": f"tcp://127.0.0.1:{port}",
        "kv_events_replay_bind": f"tcp://127.0.0.1:{replay}"})
    cluster.start()
    cluster.events_address = f"tcp://127.0.0.1:{port}"
    cluster.replay_address = f"tcp://127.0.0.1:{replay}"
    ctx = zmq.Context()
    try:
        yield cluster, ctx
    finally:
        ctx.term() if False else ctx.destroy(linger=0)
        cluster.stop()


def _joined(sub: Subscriber, client: cellar.Client, name: str) -> tuple[int, int]:
    """Put probes until the subscriber sees one (a SUB joins asynchronously); the last seq
    and how many probes were put (`{name}/join-{i}` for i below it)."""
    for i in range(200):
        client.put(f"{name}/join-{i}", PAGE)
        if sub.sock.poll(50):
            seq, _ = sub.next()
            while sub.sock.poll(200):
                seq, _ = sub.next()
            return seq, i + 1
    pytest.fail("the subscriber never joined")


def test_stored_removed_evicted_cleared_without_gaps(events_cluster):
    cluster, ctx = events_cluster
    sub = Subscriber(ctx, cluster.events_address, b"kv/default/")
    client = cellar.connect(cluster.address, timeout_s=30.0)
    try:
        last, joins = _joined(sub, client, "gapless")
        keys = [f"gapless/{i:03d}" for i in range(100)]
        for key in keys:
            client.put(key, PAGE)
        stored: list[int] = []
        while len(stored) < 100:
            seq, batch = sub.next()
            assert seq == last + 1, "a sequence gap"
            last = seq
            assert batch.data_parallel_rank == 0
            for ev in batch.events:
                assert isinstance(ev, BlockStored) and ev.medium == "CPU"
                stored += ev.block_hashes
        assert stored == [key_hash(k) for k in keys]

        assert client.remove(keys[3]) and client.remove(keys[4])
        removed: list[int] = []
        while len(removed) < 2:
            seq, batch = sub.next()
            assert seq == last + 1
            last = seq
            removed += [h for ev in batch.events if isinstance(ev, BlockRemoved)
                        for h in ev.block_hashes]
        assert removed == [key_hash(keys[3]), key_hash(keys[4])]

        # evictions: fill 3x the 64 MiB cluster with 256 KiB pages; every key no longer
        # there has had its BlockRemoved, and no key still there has
        fill = [f"evict/{i:04d}" for i in range(768)]
        for key in fill:  # pages of one size: each put evicts one page (max_evictions_per_put)
            client.put(key, PAGE)
        # the join probes are stored pages too: their evictions are events as well
        written = fill + keys + [f"gapless/join-{i}" for i in range(joins)]
        there = client.exists_many(written)
        gone_keys = {key_hash(k) for k, ok in zip(written, there, strict=True) if not ok}
        present = {key_hash(k) for k, ok in zip(written, there, strict=True) if ok}
        gone_keys -= {key_hash(keys[3]), key_hash(keys[4])}
        assert len(gone_keys) > 100
        evicted: set[int] = set()
        stored_fill = 0
        while stored_fill < len(fill) or not gone_keys <= evicted:
            seq, batch = sub.next()
            assert seq == last + 1
            last = seq
            for ev in batch.events:
                if isinstance(ev, BlockRemoved):
                    evicted.update(ev.block_hashes)
                elif isinstance(ev, BlockStored):
                    stored_fill += 1
        assert evicted == gone_keys and evicted.isdisjoint(present)

        # RemoveAll: one AllBlocksCleared, no BlockRemoved per object
        assert client.remove_all() > 0
        seq, batch = sub.next()
        assert seq == last + 1
        assert [type(ev) for ev in batch.events] == [AllBlocksCleared]
        assert not sub.sock.poll(300)
    finally:
        client.close()
        sub.close()


def test_replay_gives_exactly_the_missed_batches(events_cluster):
    cluster, ctx = events_cluster
    client = cellar.connect(cluster.address, timeout_s=30.0)
    sub = Subscriber(ctx, cluster.events_address, b"kv/default/")
    try:
        last, _ = _joined(sub, client, "replay")
        sub.close()  # the subscriber goes away and misses 50 batches
        missed = [f"replay/missed-{i:02d}" for i in range(50)]
        for key in missed:
            client.put(key, b"m" * 100)
        got = _replay(ctx, cluster.replay_address, last + 1)
        assert [seq for seq, _ in got] == list(range(last + 1, last + 51))
        assert [ev.block_hashes for _, b in got for ev in b.events] == \
            [[key_hash(k)] for k in missed]
        assert _replay(ctx, cluster.replay_address, last + 1, b"kv/default/") == got
        assert _replay(ctx, cluster.replay_address, 1, b"kv/nobody/") == []
    finally:
        client.close()


def test_grpc_stream_is_per_tenant_and_resumable(events_cluster):
    cluster, _ctx = events_cluster
    alice_token, bob_token = cluster.token_for("alice"), cluster.token_for("bob")
    alice = cellar.connect(cluster.address, tenant="alice", token=alice_token, timeout_s=30.0)
    bob = cellar.connect(cluster.address, tenant="bob", token=bob_token, timeout_s=30.0)
    channel = grpc.insecure_channel(cluster.address)
    stub = pb_grpc.MasterStub(channel)
    try:
        alice.put("a/first", b"a")
        bob_stream = stub.WatchKvEvents(pb.KvEventsRequest(
            header=pb.RequestHeader(tenant="bob", token=bob_token), from_seq=1))
        seen: list[tuple[int, list[int]]] = []
        done = threading.Event()

        def read() -> None:
            for batch in bob_stream:
                decoded = DECODE(batch.payload)
                seen.append((batch.seq, [h for ev in decoded.events for h in ev.block_hashes]))
                if len(seen) == 3:
                    done.set()
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        for i in range(20):
            alice.put(f"a/{i}", b"a")
        for i in range(3):
            bob.put(f"b/{i}", b"b")
        assert done.wait(30), seen
        bob_stream.cancel()
        assert seen == [(i + 1, [key_hash(f"b/{i}")]) for i in range(3)]  # never alice's

        # resumable: alice from seq 5 gets her batches 5.. in order
        alice_stream = stub.WatchKvEvents(pb.KvEventsRequest(
            header=pb.RequestHeader(tenant="alice", token=alice_token), from_seq=5))
        first = [next(alice_stream) for _ in range(3)]
        alice_stream.cancel()
        assert [b.seq for b in first] == [5, 6, 7]
        assert [DECODE(b.payload).events[0].block_hashes for b in first] == \
            [[key_hash(f"a/{i}")] for i in (3, 4, 5)]

        # a tenant token cannot watch another tenant's stream
        foreign = stub.WatchKvEvents(pb.KvEventsRequest(
            header=pb.RequestHeader(tenant="alice", token=bob_token)))
        with pytest.raises(grpc.RpcError) as refused:
            next(foreign)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        channel.close()
        alice.close()
        bob.close()


def test_engine_hashes_ride_in_block_hashes(events_cluster):
    """An object put with an engine hash (PutHints.engine_hashes) is told by that hash in its
    BlockStored and BlockRemoved: signed and unsigned 64-bit ints and a bytes digest alike;
    a key without one keeps its key hash; a malformed one is refused by the SDK and by the
    master (raw PutStart), and the refused put stores nothing and publishes nothing."""
    cluster, ctx = events_cluster
    token = cluster.token_for("engine")
    sub = Subscriber(ctx, cluster.events_address, b"kv/engine/")
    client = cellar.connect(cluster.address, tenant="engine", token=token, timeout_s=30.0)
    channel = grpc.insecure_channel(cluster.address)
    try:
        last, _ = _joined(sub, client, "eh")
        digest = bytes(range(32))
        hashes: dict[str, int | bytes] = {"eh/signed": -(1 << 63), "eh/unsigned": (1 << 64) - 1,
                                          "eh/digest": digest}
        keys = [*hashes, "eh/plain"]
        statuses = client.put_many([(k, b"v" * 1000) for k in keys],
                                   hints=PutHints(engine_hashes=hashes))
        assert statuses == [cellar.Status.OK] * 4
        stored: list[int | bytes] = []
        while len(stored) < 4:
            seq, batch = sub.next()
            assert seq == last + 1
            last = seq
            stored += [h for ev in batch.events for h in ev.block_hashes]
        assert stored == [-(1 << 63), (1 << 64) - 1, digest, key_hash("eh/plain")]

        assert client.remove("eh/digest")
        seq, batch = sub.next()
        assert seq == last + 1
        last = seq
        assert [(type(ev), ev.block_hashes) for ev in batch.events] == [(BlockRemoved, [digest])]

        for bad in (1 << 64, b"", b"x" * 33, "text", True):
            with pytest.raises(cellar.InvalidArgument, match="engine_hashes"):
                client.put("eh/bad", b"v", hints=PutHints(engine_hashes={"eh/bad": bad}))
        stub = pb_grpc.MasterStub(channel)
        header = pb.RequestHeader(tenant="engine", token=token)
        for raw in (b"\x07" + b"1" * 8, b"\x02" + b"x" * 33, b"\x01" + b"1" * 3):
            reply = stub.PutStart(pb.PutStartRequest(header=header, items=[
                pb.PutItem(key="eh/raw", size_bytes=10, engine_hash=raw)]), timeout=10)
            assert reply.results[0].status == pb.INVALID, raw
            assert "engine_hash" in reply.results[0].message
        assert not client.exists("eh/raw") and not client.exists("eh/bad")
        assert not sub.sock.poll(300)  # the refused puts published nothing
    finally:
        channel.close()
        client.close()
        sub.close()


def test_a_master_with_events_stops_cleanly_on_sigterm() -> None:
    """SIGTERM stops a master publishing events with exit code 0 and no traceback (its
    publisher's stop once raised TypeError: a `_stop` attribute shadowed Thread._stop)."""
    port = free_port()
    cluster = LocalCluster(1, "16MiB", master_flags={
        "kv_events_bind": f"tcp://127.0.0.1:{port}",
        "kv_events_replay_bind": f"tcp://127.0.0.1:{free_port()}"})
    cluster.start()
    try:
        with cellar.connect(cluster.address) as client:
            client.put("stop/k", PAGE)  # one batch published
        master = cluster.masters[0]
        assert master.proc is not None
        master.proc.send_signal(signal.SIGTERM)
        code = master.proc.wait(timeout=30)
        log = master.log_path.read_text(errors="replace")
        assert code == 0, master.describe_exit()
        assert "Traceback" not in log, log[-2000:]
    finally:
        cluster.stop()
