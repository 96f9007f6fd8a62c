"""cellar.master: the metadata master (the room that owns every piece of metadata).

It owns the object table and its state machine, per-segment allocators, placement, pins,
eviction, tenants and quotas, quarantine of freed ranges and node membership, all mutated from
one asyncio event loop (no locks). `service.MasterService` is the behaviour as plain methods
(split by subsystem: requests, replies, quota, tombstones, grace, node_rpcs, listing);
`servicer` is the thin gRPC adapter; `admin` serves /metrics, /health and the JSON admin API;
`main` is `cellar master`;
`rebuild` re-creates objects, allocator state and tenant usage from the nodes' index reports
after a master or node restart.
`statuspage` renders the HTML page at `/` and `events` keeps the bounded log of failovers,
rebuilds and node expiries it shows (the log lives in `leadership`, which outlives a service).

Metadata transports: gRPC (`servicer`) is the API and serves every RPC. Beside it, on the same
event loop, `fastrpc` serves the five hottest RPCs (PutStart, PutEnd, PutRevoke, GetReplicas,
Unpin) as length-prefixed frames carrying the same protobuf messages over persistent TCP, through
the same servicer bodies: about 0.12 ms per round trip instead of gRPC's 0.8 ms, which is what
makes a 1 ms single get possible. Clients learn its port from ClusterStatus's trailing metadata
and fall back to gRPC whenever it is unreachable; see `fastrpc` for the frame and its limits.

It never touches payload bytes (its gRPC messages stay under a few MiB to prove it) and never
imports cellar.client, cellar.transfer or cellar.storage_node.
Import rule: must not import cellar.client.*, cellar.transfer.*, cellar.storage_node.*, cellar.bench.*, cellar.integrations.*, cellar.compat.*
"""
