"""cellar.master.state: the master's metadata tables, plain Python and nothing else.

What it owns: every table the master's decisions read and write, one subsystem a module:
- allocator: one segment's offset space (TLSF bins), the essay on why;
- membership: nodes, their segments and liveness (ACTIVE -> SUSPECT -> EXPIRED), the
  freed-range outbox a node drains through its heartbeats;
- objects: the object table and its state machine (WRITING -> COMPLETE -> DROPPED) and the one
  place a tenant is charged for bytes (`charge`);
- tenants: isolated namespaces and their quotas; pins: read leases with a TTL;
- eviction: approximate LRU pools (Redis's lineage); quarantine: freed ranges a late write could
  still reach; read_frees: freed ranges an old read grant could still reach through the node
  until it applies the notice (a shm/rdma write over one claims it first); tombstones: removed
  keys a late report must not revive; ahead_drops: the outstanding put-ahead allocations and
  the versions dropped behind them, which such an allocation must not be bound past;
- placement: which segment takes a replica (power of n choices over free space);
- tiers: a node's disk below its DRAM (demotion, promotion, disk eviction); coldest: the order
  they take a segment's objects in (a partial sort, sampled past 4,096 objects);
- expiry, ids: the deadline runs and the ids the tables share;
- records: the record types they share (Obj, Replica, Tenant, Node, Segment, Pool), which
  name each other, so they live in one module and no import cycle forms, not even a type-only
  one; audit: the full O(n) check of every table.

The invariant: each counter has one writer, the table that owns it (a tenant's bytes change only
through `objects.charge`, the object table's `complete_count` only in `ObjectTable`); every
transition asserts the state it leaves (cheap O(1) checks that run in production); the full
O(n) checks (`SegmentAllocator.check_invariants`) run in tests, the soak and the fault tests.

What it never does: it never serves anything (no gRPC, no HTTP, no asyncio, no sockets), never
reads a clock of its own (callers pass `now`), never signs a grant and never touches payload
bytes. The behaviour around it (master/service.py, master/node_rpcs.py) decides; the serving
room (master/serving/) speaks the protocols.
Import rule: may import only cellar.master.state.*, cellar.errors
"""
