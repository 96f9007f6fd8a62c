"""Coordination through etcd: leader election for masters, leader discovery for everyone else.

Owns the only imports of the etcd client library (etcd3aio) and the layout of Cellar's keys
under `/cellar/<cluster>/`. Masters campaign with `election.LeaderElection`; nodes, clients and
the CLI find the current leader with `discovery.LeaderDiscovery`. `target` parses the
`etcd://HOST:PORT[,HOST:PORT...]/NAME` addresses they are all given; `etcd_tls` how every
one of them reaches an etcd that wants TLS and a client certificate (set by the environment).

The master link, once for every caller: `link` decides what to do after each answer of a
master (retry with bounded backoff, follow a redirect, ask etcd, switch, fence by epoch) as
sans-I/O plans that the SDK's sync and asyncio faces and the storage node drive with their
own I/O; `follow.next_master` is its choice of master; `redirect` writes and reads the
redirect a master that does not lead answers with.

Must not: know master internals (object tables, grants), hold payload bytes, or import the
client, master or storage_node packages. The embedded default (`cellar up`) never loads it.
Import rule: must not import cellar.client.*, cellar.master.*, cellar.storage_node.*, cellar.transfer.*, cellar.bench.*
"""
