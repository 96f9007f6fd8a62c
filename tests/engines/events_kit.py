"""A cluster with KV events on, and every retained event of a tenant read back from the
replay socket (no SUB join race), for the engine tests of engine hashes in events."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import zmq

from cellar.devtools.ports import free_port


def event_flags() -> tuple[dict[str, str], str]:
    """Master flags that turn events on, and the replay address."""
    replay = f"tcp://127.0.0.1:{free_port()}"
    return {"kv_events_bind": f"tcp://127.0.0.1:{free_port()}",
            "kv_events_replay_bind": replay}, replay


def replayed_events(address: str, tenant: str = "default") -> list[list[Any]]:
    """Every retained event of `tenant`, decoded as plain msgpack arrays."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    decode = msgspec.msgpack.Decoder().decode
    try:
        dealer.send_multipart([b"", (1).to_bytes(8, "big"), f"kv/{tenant}/".encode()])
        events: list[list[Any]] = []
        while True:
            assert dealer.poll(10_000), "the replay socket did not answer"
            _, seq, payload = dealer.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                return events
            _ts, batch, _rank = decode(payload)
            events += batch
    finally:
        dealer.close()
        ctx.destroy(linger=0)


def hashes_of(events: list[list[Any]], kind: str) -> list[Any]:
    return [h for ev in events if ev[0] == kind for h in ev[1]]


def wait_hashes(address: str, kind: str, count: int, *, exclude: Any = None,
                tries: int = 100) -> list[Any]:
    """The block hashes of `kind` events (without `exclude`) once at least `count` are there
    (a call's events are flushed on the master's next loop turn), or what there is."""
    got: list[Any] = []
    for _ in range(tries):
        got = [h for h in hashes_of(replayed_events(address), kind) if h != exclude]
        if len(got) >= count:
            break
        time.sleep(0.05)
    return got
