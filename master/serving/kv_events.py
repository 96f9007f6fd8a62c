"""KV events: the object lifecycle in vLLM's KV-event wire format, for routers and indexers.

What it owns
    `KvEventHub`, the master's one lifecycle observer (master/state/lifecycle.py) when
    `--kv-events-bind` is set, and `ZmqPublisher`, the thread that owns the ZMQ sockets.

The wire format (vLLM's `vllm/distributed/kv_events.py`, which Dynamo's router, llm-d's indexer
and LMCache's controller read; Cellar's own code)
    PUB socket, one multipart message per batch: [topic, seq (8 bytes, big-endian), payload];
    payload = msgpack array EventBatch [ts (float, Unix s), [event, ...], data_parallel_rank (0)];
    each event a tagged array (msgspec `tag=True, array_like=True`):
        ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
        ["BlockRemoved", block_hashes, medium]
        ["AllBlocksCleared"]
    Cellar fills block_hashes with one hash per object: the engine's own page or chunk hash
    when the writer recorded one at put time (the SGLang and LMCache adapters do; an int, or
    bytes for a bytes digest: proto/engine_hash.py), else `key_hash` (the first 8 bytes of
    BLAKE2b of the key, big-endian, unsigned); parent_block_hash None, token_ids [],
    block_size 0, lora_id None, medium "CPU" (DRAM) or "DISK" (every replica on a node's
    disk tier); a demotion or a promotion is a BlockRemoved on the old medium and a
    BlockStored on the new.
    Replay: a ROUTER socket. A DEALER sends [b"", start_seq (8 bytes)] (vLLM's request) and may
    add a third frame, the topic; the answer is [b"", seq, payload] for every retained batch of
    that topic with seq >= start_seq, then [b"", -1 (8 bytes, signed), b""].

Topics and sequences
    One topic per tenant, `kv/<tenant>/` (tenant names cannot hold "/", so no topic is a prefix
    of another); a replay request without a topic frame replays the default tenant. Each topic
    numbers its batches 1, 2, 3, ... without gaps, so a subscriber of one tenant sees a gap only
    when it missed something, and asks the replay socket for it. A new master process (or a new
    leader) starts again at 1; routers treat that as a new publisher.

Never blocking the request path
    The observer only appends to a pending list (one tuple per event) and schedules one flush
    per loop turn. The flush (on the loop, between requests) groups the turn's events into one
    batch per tenant, numbers and encodes it, keeps it in the tenant's replay ring (the last
    `replay_batches`) and hands it to the PUB socket without blocking (`ZmqPublisher.send`,
    on the loop thread: ZMQ's own I/O thread, which holds no GIL, does the network sends). A
    PUB socket never blocks its sender: a subscriber `queue_batches` behind (the socket's send
    high-water mark) misses live batches, finds the gap by seq and replays it. A send ZMQ
    refuses is counted (`master_kv_events_dropped_total`); the replay copy is kept either way.
    Why not a publisher thread with a queue in front of it (the design before 2026-12-04):
    each batch then cost a queue hand-off, a thread wake-up and a GIL hand-over on the
    master's two busiest moments (a put's and a remove's reply), 5-6% of the 128 x 64 KiB put
    rate on two cores (`make bench`'s events row), against ~1% for the send itself.

Who can subscribe
    ZMQ has no credentials: anyone who reaches the bind address reads every tenant's events.
    Bind it to a trusted network (loopback by default in examples), or use the authenticated
    gRPC stream (`WatchKvEvents`, own tenant only), which serves the same batches.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from cellar.master.state.records import Obj, on_disk_only
from cellar.proto.engine_hash import decode as decode_engine_hash

log = logging.getLogger("cellar.master")

MEDIUM_DRAM = "CPU"
MEDIUM_DISK = "DISK"  # an object all of whose replicas sit on nodes' disk tiers


def medium_of(obj: Obj) -> str:
    """The medium a read of `obj` is served from: its fastest replica's."""
    return MEDIUM_DISK if on_disk_only(obj) else MEDIUM_DRAM


def _stored(obj: Obj, medium: str) -> tuple[Any, ...]:
    return ("BlockStored", [block_hash(obj)], None, [], 0, None, medium)
MAX_EVENTS_PER_BATCH = 4096        # events in one EventBatch (a bigger turn is split)
DEFAULT_QUEUE_BATCHES = 4096       # batches queued per subscriber (the PUB high-water mark)
DEFAULT_REPLAY_BATCHES = 4096      # batches kept per tenant for replay and the gRPC stream
END_SEQ = (-1).to_bytes(8, "big", signed=True)
DEFAULT_TENANT_TOPIC = "default"
ZMQ_LAST_ENDPOINT = 32  # zmq.LAST_ENDPOINT (the module is imported lazily)


_BLAKE2B_8 = hashlib.blake2b(digest_size=8)  # copied per key: a third cheaper than a new one


def key_hash(key: str) -> int:
    """The stable 64-bit block hash of a key (see the module docstring)."""
    h = _BLAKE2B_8.copy()
    h.update(key.encode())
    return int.from_bytes(h.digest(), "big")


def block_hash(obj: Obj) -> int | bytes:
    """The block hash events carry for an object: the engine's own hash when its writer
    recorded one (`PutItem.engine_hash`, proto/engine_hash.py), else `key_hash`."""
    return decode_engine_hash(obj.engine_hash) if obj.engine_hash else key_hash(obj.key)


def topic_of(tenant: str) -> bytes:
    return f"kv/{tenant}/".encode()


class KvEventHub:
    """The lifecycle observer and the per-tenant streams (see the module docstring)."""

    def __init__(self, *, replay_batches: int = DEFAULT_REPLAY_BATCHES) -> None:
        import msgspec  # the events extra; checked at start (main) with a clear message

        assert replay_batches >= 1
        self._encode = msgspec.msgpack.Encoder().encode
        self.replay_batches = replay_batches
        # the live send of a batch (topic, seq, payload) -> sent; None: replay and gRPC only
        self.send: Callable[[bytes, int, bytes], bool] | None = None
        self._pending: dict[str, list[tuple[Any, ...]]] = {}
        self._scheduled = False
        self._muted: set[str] = set()
        self._seq: dict[str, int] = {}
        self._rings: dict[str, deque[tuple[int, bytes]]] = {}
        self.lock = threading.Lock()  # the rings, read by the replay thread
        self.wakeup = asyncio.Event()  # set (and replaced) by each flush that published
        self.loop: asyncio.AbstractEventLoop | None = None
        self.events = 0
        self.batches = 0
        self.dropped_batches = 0

    # ---- the observer (on the loop, mid-transition: note and return) ----------------------

    def stored(self, obj: Obj) -> None:
        tenant = obj.tenant.name
        if tenant in self._muted:
            return
        self._note(tenant, _stored(obj, medium_of(obj)))

    def dropped(self, obj: Obj) -> None:
        tenant = obj.tenant.name
        if tenant in self._muted:
            return
        self._note(tenant, ("BlockRemoved", [block_hash(obj)], medium_of(obj)))

    def moved(self, obj: Obj, on_disk: bool) -> None:
        """A demotion (or a promotion): gone from one medium, stored in the other."""
        tenant = obj.tenant.name
        if tenant in self._muted:
            return
        before, after = (MEDIUM_DRAM, MEDIUM_DISK) if on_disk else (MEDIUM_DISK, MEDIUM_DRAM)
        self._note(tenant, ("BlockRemoved", [block_hash(obj)], before))
        self._note(tenant, _stored(obj, after))

    def clearing(self, tenant: str) -> _Clearing:
        """`with hub.clearing(tenant): service.remove_all(...)`: the drops inside are one
        AllBlocksCleared."""
        return _Clearing(self, tenant)

    def _note(self, tenant: str, event: tuple[Any, ...]) -> None:
        pending = self._pending.get(tenant)
        if pending is None:
            self._pending[tenant] = [event]
        else:
            pending.append(event)
        if not self._scheduled:
            self._scheduled = True
            loop = self.loop
            if loop is None:  # no loop (unit use): flush at once
                self.flush()
            else:
                loop.call_soon(self.flush)

    # ---- the flush (on the loop, between requests) ---------------------------------------

    def flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        now = time.time()
        for tenant, events in pending.items():
            for start in range(0, len(events), MAX_EVENTS_PER_BATCH):
                chunk = events[start:start + MAX_EVENTS_PER_BATCH]
                payload = self._encode([now, chunk, 0])
                self._publish(tenant, payload, len(chunk))
        if pending:
            self.wakeup.set()
            self.wakeup = asyncio.Event()

    def _publish(self, tenant: str, payload: bytes, events: int) -> None:
        seq = self._seq.get(tenant, 0) + 1
        self._seq[tenant] = seq
        with self.lock:
            ring = self._rings.get(tenant)
            if ring is None:
                ring = self._rings[tenant] = deque(maxlen=self.replay_batches)
            ring.append((seq, payload))
        self.events += events
        self.batches += 1
        send = self.send
        if send is not None and not send(topic_of(tenant), seq, payload):
            self.dropped_batches += 1

    # ---- readers: the replay thread and the gRPC stream ----------------------------------

    def since(self, tenant: str, start_seq: int) -> list[tuple[int, bytes]]:
        """The retained batches of `tenant` with seq >= start_seq (any thread)."""
        with self.lock:
            ring = self._rings.get(tenant)
            return [] if ring is None else [b for b in ring if b[0] >= start_seq]

    def oldest(self, tenant: str) -> int:
        """The oldest retained seq of `tenant` (next seq if none is retained)."""
        with self.lock:
            ring = self._rings.get(tenant)
            if ring:
                return ring[0][0]
        return self._seq.get(tenant, 0) + 1

    def last_seq(self, tenant: str) -> int:
        return self._seq.get(tenant, 0)

    def collector(self) -> Collector:
        return _HubCollector(self)


class _Clearing:
    def __init__(self, hub: KvEventHub, tenant: str) -> None:
        self.hub, self.tenant = hub, tenant

    def __enter__(self) -> None:
        self.hub._muted.add(self.tenant)

    def __exit__(self, *exc: object) -> None:
        self.hub._muted.discard(self.tenant)
        if exc[0] is None:
            self.hub._note(self.tenant, ("AllBlocksCleared",))


class _HubCollector(Collector):
    def __init__(self, hub: KvEventHub) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        hub = self.hub
        for name, doc, value in (
                ("master_kv_events", "KV events published", hub.events),
                ("master_kv_event_batches", "KV event batches published", hub.batches),
                ("master_kv_events_dropped", "KV event batches the PUB socket refused to send "
                 "live (still in the replay ring)", hub.dropped_batches)):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], value)
            yield family


class ZmqPublisher(threading.Thread):
    """Owns the PUB socket (the loop thread sends on it: `send`) and, in its own thread, the
    ROUTER socket answering replay requests (a ZMQ socket is never shared between threads)."""

    POLL_MS = 100  # how often the replay thread looks at its stop flag

    def __init__(self, hub: KvEventHub, bind: str, replay_bind: str,
                 queue_batches: int = DEFAULT_QUEUE_BATCHES) -> None:
        super().__init__(name="cellar-kv-events-replay", daemon=True)
        import zmq  # the events extra; checked at start (main) with a clear message

        assert queue_batches >= 1
        self.hub = hub
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, queue_batches)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self.bound = self._bind(self._pub, bind)
        self.replay_bound = self._bind(self._router, replay_bind)
        self._send_multipart = self._pub.send_multipart
        self._noblock = zmq.NOBLOCK
        self._errors = 0
        self._stopping = threading.Event()

    @staticmethod
    def _bind(sock: Any, address: str) -> str:
        if address.endswith(":0"):
            port = sock.bind_to_random_port(address.rsplit(":", 1)[0])
            return f"{address.rsplit(':', 1)[0]}:{port}"
        sock.bind(address)
        return str(sock.getsockopt_string(ZMQ_LAST_ENDPOINT))

    def start(self) -> None:
        """Send the hub's batches from now on, and answer replay requests."""
        self.hub.send = self.send
        super().start()

    def send(self, topic: bytes, seq: int, payload: bytes) -> bool:
        """One batch to every subscriber, never blocking (on the loop thread); False when ZMQ
        refused it."""
        try:
            self._send_multipart((topic, seq.to_bytes(8, "big"), payload), self._noblock)
            return True
        except self._zmq.ZMQError as exc:  # the batch stays in the replay ring
            self._errors += 1
            if self._errors & (self._errors - 1) == 0:  # 1, 2, 4, ...: no flood
                log.warning("kv events: send failed (%d so far): %s", self._errors, exc)
            return False

    def run(self) -> None:
        router = self._router
        while not self._stopping.is_set():
            # waits in ZMQ (no GIL held) until a request comes or POLL_MS passes
            while router.poll(self.POLL_MS):
                self._replay(router.recv_multipart())
                if self._stopping.is_set():
                    break
        router.close()

    def _replay(self, frames: list[bytes]) -> None:
        # [identity, b"", start_seq] or [identity, b"", start_seq, topic]; anything else is ignored
        if len(frames) not in (3, 4) or frames[1] != b"" or len(frames[2]) != 8:
            return
        identity = frames[0]
        tenant = DEFAULT_TENANT_TOPIC
        if len(frames) == 4:
            topic = frames[3].decode(errors="replace")
            if not (topic.startswith("kv/") and topic.endswith("/")) or len(topic) > 140:
                self._router.send_multipart((identity, b"", END_SEQ, b""))
                return
            tenant = topic[3:-1]
        start = int.from_bytes(frames[2], "big")
        for seq, payload in self.hub.since(tenant, start):
            self._router.send_multipart((identity, b"", seq.to_bytes(8, "big"), payload))
        self._router.send_multipart((identity, b"", END_SEQ, b""))

    def stop(self) -> None:
        """Stop sending and replaying; call it on the loop thread (the PUB socket's)."""
        self.hub.send = None
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=2.0)
        self._pub.close()
        if not self.is_alive():  # the ROUTER is closed: nothing left in the context
            self._ctx.term()
