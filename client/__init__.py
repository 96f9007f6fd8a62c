"""cellar.client: the SDK.

What it owns
    The Python API applications use (`cellar.connect` -> `Client`, `cellar.alloc_buffer`). A
    client talks gRPC to the master for metadata only (where a key lives, grants, pins) and
    moves payload bytes itself, through `cellar.transfer`, straight to and from the storage
    nodes that hold them. The master never sees a payload byte.

The room
    - `core.py`   the protocol logic every face shares: argument checks, request building,
                  per-key status -> exception mapping, replica and transport choice, the
                  put/get state machines, checksums, node health and the unpin queue. No I/O.
    - `sync.py`   `Client`, the blocking face (threads); `connect`.
    - `rpc.py`    the sync face's gRPC channel to the master: deadlines, bounded retries.
    - `buffers.py` caller buffers as flat byte views (no copies), `alloc_buffer`.
    - `pointers.py` registered raw (ptr, size) ranges and the views over them.
    - `tensors.py` torch tensors: zero-copy views, the dtype/shape header stored in values.
    - `metrics.py` the client's Prometheus metrics (`REGISTRY`, `serve_metrics`).
    - `cli.py`    `cellar status|put|get|rm`.
    An `AsyncClient` (asyncio face) reuses `core` with a `grpc.aio` channel, as httpx's
    `AsyncClient` reuses its core.

What it guarantees
    A put becomes visible only when every replica is written (PutStart, parallel writes,
    PutEnd); a failed put is revoked, never half-visible. A get returns only bytes whose
    xxh3_64 matches the checksum recorded at PutEnd, falling back to other replicas.

What it must never do
    Import `cellar.master` or `cellar.storage_node`, or send payload through the master.
Import rule: must not import cellar.master.*, cellar.storage_node.*, cellar.bench.*, cellar.integrations.*, cellar.compat.*
"""

from cellar.client.buffers import alloc_buffer
from cellar.client.sync import Client, connect

__all__ = ["Client", "alloc_buffer", "connect"]
