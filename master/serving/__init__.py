"""cellar.master.serving: the servers around the master's behaviour, and the process's roles.

What it owns: every protocol the master speaks and the objects that live as long as the process:
- servicer: the thin gRPC adapter over `MasterService` (one body per RPC, status codes);
- fastrpc: the fast line, the five hottest RPCs as length-prefixed frames on the same loop;
- http_api: /metrics, /health and the JSON admin API (tenants, quotas, tokens);
- status_page: the HTML page at `/`; cluster_summary: the one summary ClusterStatus, the status
  page and the admin API all read; events: the bounded log of failovers, rebuilds and expiries;
- metrics: the Prometheus collectors; auth: who may call what (tenant, node, admin identities),
  and grpc_auth: the interceptor that asks it before every gRPC handler;
- leadership: the role of this process (single, leader, follower), the election, the service it
  serves and the rebuild after a failover; removal_log, tenant_log and token_log: what outlives
  a leader (acknowledged removes, the API's tenants and tokens), in a file or in etcd.

The invariant: it decides nothing about metadata. A request is checked for identity here, then
handed whole to `MasterService` or its node RPCs; what they return is encoded and sent.
What it never does: it never writes a table of `cellar.master.state` itself and never touches
payload bytes (its gRPC message limit stays at a few MiB to prove it).
Import rule: must not import cellar.client.*, cellar.transfer.*, cellar.storage_node.*, cellar.bench.*, cellar.integrations.*, cellar.compat.*
"""
