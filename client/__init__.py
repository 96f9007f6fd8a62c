"""cellar.client: the SDK.

What it owns
    The Python API applications use (`cellar.connect` -> `Client`, `cellar.alloc_buffer`). A
    client talks gRPC to the master for metadata only (where a key lives, grants, pins) and
    moves payload bytes itself, through `cellar.transfer`, straight to and from the storage
    nodes that hold them. The master never sees a payload byte.

The room (one sans-I/O core, two faces, as httpx's `Client` and `AsyncClient`)
    - `checks.py`   argument checks, the client's limits, the credential lookup
    - `statuses.py` per-key statuses, MISS/LATE, status and gRPC code -> exception
    - `session_state.py` reply decoding and the state a client keeps between calls (node
                    health, unpin queue, epoch fence, transport choice per replica and
                    transfer-round budgets)
    - `puts.py`, `gets.py` the put and get state machines (no I/O)
    - `early_reads.py` where this client last read each key, so a get can read it beside its
                    GetReplicas (kept only if the reply confirms the allocation)
    - `one_read.py` a one-key get made in one step without the general get flow: one read
                    within its read trust, or one lookup and one read (the faces fall back
                    to the flow for anything else)
    - `put_ahead.py` write allocations held for the next puts of a size, so a put skips
                    PutStart (bound to its key at PutEnd)
    - `one_put.py`  a one-key put under a held allocation as one write and one PutEnd,
                    without the general put flow (the faces fall back to it for anything else)
    - `read_backs.py` the read grants a small put's PutEnd brings back, so the writer's next
                    get of a key is one read
    - `flows.py`    every multi-step operation as a generator of I/O requests (failover rounds,
                    retries, pin release, deadline-bounded gets, probes)
    - `key_flows.py` removes and key listing as flows (and the early-read bookkeeping a
                    remove needs)
    - `operations.py` the public operations: checks + flow + result, shared by both faces
    - `buffer_operations.py` the same for raw pointers, scatter-gather parts and tensors
    - `flow_run.py` stepping one flow for a face (`FlowRun`) and the call's metrics
    - `connect_args.py` connect arguments, client id, master address parsing
    - `probe.py`    `probe_master`: one master's own ClusterStatus, no redirect followed
    - `sync.py`     `Client`, the blocking face (threads); `connect`; `unpin_flusher.py` its
                    thread that sends pin releases no GetReplicas carried; `hash_behind.py`
                    its threads that hash put values while PutStart is in flight
    - `rpc.py`      the sync face's line to the master: gRPC + the fast line, following the leader
    - `aio.py`      `AsyncClient`, the asyncio face; `connect_async`; `aio_unpins.py` its
                    loop task that sends pin releases no GetReplicas carried; `aio_gets.py`
                    the `get` calls of one loop turn coalesced into one batch
    - `aio_rpc.py`  the asyncio face's line to the master: grpc.aio + a pipelined fast line
    - `buffers.py`  caller buffers as flat byte views (no copies), `alloc_buffer`
    - `pointers.py`, `tensors.py`, `metrics.py` registered raw memory, the torch value format,
                    the client's Prometheus metrics (sdk-buffers' pieces under the faces)
    - `cli.py`      `cellar status|put|get|rm`; `top.py` `cellar top`

What it guarantees
    A put becomes visible only when every replica is written (PutStart, parallel writes,
    PutEnd); a failed put is revoked, never half-visible. A get returns only bytes whose
    xxh3_64 matches the checksum recorded at PutEnd, falling back to other replicas.

What it must never do
    Import `cellar.master` or `cellar.storage_node`, or send payload through the master. Only
    the faces (`sync`, `aio`, `rpc`, `aio_rpc`) block or await; the rest never does.
Import rule: must not import cellar.master.*, cellar.storage_node.*, cellar.bench.*, cellar.integrations.*, cellar.compat.*
"""

from cellar.client.aio import AsyncClient, connect_async
from cellar.client.buffers import alloc_buffer
from cellar.client.puts import PutHints
from cellar.client.statuses import LATE, MISS, ClientClosed, Unauthenticated
from cellar.client.sync import Client, connect

__all__ = ["LATE", "MISS", "AsyncClient", "Client", "ClientClosed", "PutHints", "Unauthenticated",
           "alloc_buffer", "connect", "connect_async"]
