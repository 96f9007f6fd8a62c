"""cellar.master: the metadata master (the room that owns every piece of metadata).

Three layers, each a folder or a few files, dependencies pointing one way (down):
- `serving/`: the servers and the process's roles: the gRPC `servicer` (a thin adapter),
  the fast line `fastrpc`, `http_api` (/metrics, /health, the JSON admin API), `status_page`,
  `metrics`, `auth`, `leadership` (single/leader/follower, rebuild after failover) and the
  `events` log; `main` (here, so `cellar master` keeps its path) wires them into one process.
- the behaviour, plain methods over the state, no I/O: `service.MasterService` answers the
  client RPCs (put, get, probes, removal) with `requests` (input checks), `replies` (output
  types, grant signing through `grant_issuer`), `put_starts` (the checks and placement of a
  PutStart), `put_ends` (binding and completing puts),
  `put_ahead` (write allocations granted before their key is known, bound at PutEnd),
  `quota` (bounded eviction for a PutStart), `grace`
  (when a miss means "not reported yet") and `listing`; `node_rpcs.NodeRpcs` answers the
  storage nodes (mount, report/rebuild, heartbeat, unmount) and runs the background tick.
- `state/`: the tables (objects, pins, eviction, quarantine, tombstones, tenants, membership,
  allocator, placement), mutated from one asyncio event loop (no locks), importing nothing of
  gRPC, HTTP or asyncio. `config` is the typed configuration every layer reads.

Metadata transports: gRPC (`serving.servicer`) is the API and serves every RPC. Beside it, on the
same event loop, `serving.fastrpc` serves the five hottest RPCs (PutStart, PutEnd, PutRevoke,
GetReplicas, Unpin) as length-prefixed frames carrying the same protobuf messages over
persistent TCP, through the same servicer bodies: about 0.12 ms per round trip instead of gRPC's
0.8 ms, which is what makes a 1 ms single get possible. Clients learn its port from
ClusterStatus's trailing metadata and fall back to gRPC whenever it is unreachable.

It never touches payload bytes (its gRPC messages stay under a few MiB to prove it) and never
imports cellar.client, cellar.transfer or cellar.storage_node.
Import rule: must not import cellar.client.*, cellar.transfer.*, cellar.storage_node.*, cellar.bench.*, cellar.integrations.*, cellar.compat.*
"""
