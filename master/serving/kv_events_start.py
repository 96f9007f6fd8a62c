"""Starting the KV events (master/serving/kv_events.py) when `--kv-events-bind` is set.

pyzmq and msgspec are the `events` extra: a master without them starts as before, and one
given `--kv-events-bind` without them stops at start with a message naming the extra (never
at the first event).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from prometheus_client import CollectorRegistry

from cellar.master.config import MasterConfig
from cellar.master.serving.leadership import Leadership


def replay_address(config: MasterConfig) -> str:
    if config.kv_events_replay_bind:
        return config.kv_events_replay_bind
    host, _, port = config.kv_events_bind.rpartition(":")
    return f"{host}:{int(port) + 1}" if int(port) else f"{host}:0"


def start_kv_events(config: MasterConfig, leadership: Leadership,
                    registry: CollectorRegistry) -> Any:
    """The running ZmqPublisher, or None when events are off; exits the process (status 2)
    when they are asked for and cannot start."""
    if not config.kv_events_bind:
        return None
    try:
        import msgspec  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as exc:
        print(f"cellar master: --kv-events-bind needs pyzmq and msgspec "
              f"(pip install 'cellar[events]'): {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    from cellar.master.serving.kv_events import KvEventHub, ZmqPublisher

    hub = KvEventHub(replay_batches=config.kv_events_replay_batches)
    hub.loop = asyncio.get_running_loop()
    try:
        publisher = ZmqPublisher(hub, config.kv_events_bind, replay_address(config),
                                 config.kv_events_queue_batches)
    except zmq.ZMQError as exc:
        print(f"cellar master: cannot bind the KV events on {config.kv_events_bind}: {exc}",
              file=sys.stderr)
        raise SystemExit(1) from None
    publisher.start()
    leadership.observe(hub)
    registry.register(hub.collector())
    print(f"cellar master: kv events on {publisher.bound} (replay {publisher.replay_bound})",
          flush=True)
    return publisher
