"""The KV-event publisher: batches go out on the caller's (the loop's) thread through the PUB
socket, replay is answered by the publisher's own thread, a send ZMQ refuses is counted and
stays replayable, and `stop` leaves no thread or socket behind (master/serving/kv_events.py).

Real ZMQ sockets on loopback; the hub is flushed directly (no event loop, no master)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")

from cellar.master.serving.kv_events import KvEventHub, ZmqPublisher  # noqa: E402

RECV_TIMEOUT_MS = 5000


class _Tenant:
    def __init__(self, name: str) -> None:
        self.name = name


class _Obj:
    """What the hub reads of an object: tenant, key, engine hash, replicas."""

    def __init__(self, tenant: str, key: str) -> None:
        self.tenant = _Tenant(tenant)
        self.key = key
        self.engine_hash = b""
        self.replicas = ()


@pytest.fixture
def publisher() -> Iterator[ZmqPublisher]:
    hub = KvEventHub(replay_batches=8)
    pub = ZmqPublisher(hub, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", queue_batches=16)
    pub.start()
    yield pub
    pub.stop()


def _subscriber(ctx: Any, address: str) -> Any:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(address)
    return sub


def test_batches_are_sent_on_the_flushing_thread_and_replayed(publisher: ZmqPublisher) -> None:
    hub = publisher.hub
    ctx = zmq.Context()
    try:
        sub = _subscriber(ctx, publisher.bound)
        # a PUB socket drops what it sends before the subscription arrives: send until one lands
        for attempt in range(200):
            hub.stored(_Obj("t", f"warm-{attempt}"))  # no loop: the note flushes at once
            if sub.poll(50):
                break
        else:
            pytest.fail("the subscriber never received a batch")
        while sub.poll(100):
            sub.recv_multipart()
        sent_by: list[str] = []
        real_send = hub.send
        assert real_send is not None

        def recording_send(topic: bytes, seq: int, payload: bytes) -> bool:
            sent_by.append(threading.current_thread().name)
            return real_send(topic, seq, payload)

        hub.send = recording_send
        hub.dropped(_Obj("t", "k1"))
        topic, seq, payload = sub.recv_multipart()
        assert sent_by == [threading.current_thread().name]  # no hand-off to another thread
        assert topic == b"kv/t/"
        last = int.from_bytes(seq, "big")
        assert last == hub.last_seq("t")
        _ts, events, _rank = msgspec.msgpack.decode(payload)
        assert events[0][0] == "BlockRemoved"

        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
        dealer.connect(publisher.replay_bound)
        dealer.send_multipart([b"", last.to_bytes(8, "big"), b"kv/t/"])
        assert dealer.recv_multipart() == [b"", seq, payload]
        assert dealer.recv_multipart()[1] == (-1).to_bytes(8, "big", signed=True)
    finally:
        ctx.destroy(0)


def test_a_refused_send_is_counted_and_still_replayable(publisher: ZmqPublisher) -> None:
    hub = publisher.hub
    publisher._pub.close()  # every send now fails inside ZMQ
    before = hub.dropped_batches
    hub.stored(_Obj("t", "k"))
    assert hub.dropped_batches == before + 1
    seq = hub.last_seq("t")
    assert [s for s, _payload in hub.since("t", seq)] == [seq]


def test_stop_ends_the_replay_thread_and_sending() -> None:
    hub = KvEventHub(replay_batches=8)
    pub = ZmqPublisher(hub, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
    pub.start()
    assert hub.send is not None and pub.is_alive()
    pub.stop()
    assert hub.send is None and not pub.is_alive()
    hub.stored(_Obj("t", "k"))  # after stop: kept for the gRPC stream, nothing sent
    assert hub.dropped_batches == 0 and hub.last_seq("t") == 1


def test_queue_batches_must_be_positive() -> None:
    with pytest.raises(AssertionError):
        ZmqPublisher(KvEventHub(), "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", queue_batches=0)
