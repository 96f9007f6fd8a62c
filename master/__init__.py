"""cellar.master: the metadata master (the room that owns every piece of metadata).

It owns the object table and its state machine, per-segment allocators, placement, pins,
eviction, tenants and quotas, quarantine of freed ranges and node membership, all mutated from
one asyncio event loop (no locks). `service.MasterService` is the behaviour as plain methods;
`servicer` is the thin gRPC adapter; `admin` serves /metrics, /health and the JSON admin API;
`main` is `cellar master`.

It never touches payload bytes (its gRPC messages stay under a few MiB to prove it) and never
imports cellar.client, cellar.transfer or cellar.storage_node.
"""
