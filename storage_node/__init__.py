"""cellar.storage_node: a storage node contributing DRAM segments to the cluster.

Owns one or more segments (shared-memory files mapped into this process), serves the data
plane for them through a transfer server (`cellar.transfer.tcp_server`), mounts them on the
master and heartbeats, and keeps its own index of the objects it holds so that a new master
can rebuild from it. Every data-plane request is checked against the segment bounds and the
grant the master signed before a byte of segment memory is touched.

Modules: `config` (NodeConfig), `segment` (the mapped memory, re-attached after a restart),
`index` (objects held, sealing, tombstones, the write floor; its records and refusals in
`index_records`), `journal` (the index persisted
beside the segments), `verifier` (re-checks restored objects' checksums), `clock` (the
master's clock and epoch as this node sees them), `access` (the `SegmentAccess` the transfer
server calls), `master_link` (the link to the master: mount, index report, heartbeat loop),
`heartbeat_cargo` (what rides on a heartbeat: lost replicas, tier moves), `freed_acks`
(the freed-range notices a heartbeat brings, applied and acknowledged), `disk_tier` (the disk
file and the node-local moves), `metrics` (Prometheus and HTTP), `node` (wiring, start/stop
order), `main` (`cellar node`).

It never imports `cellar.client` or `cellar.master`: the only contract with the master is
`cellar.proto`.
Import rule: must not import cellar.client.*, cellar.master.*, cellar.bench.*, cellar.integrations.*, cellar.compat.*
"""
