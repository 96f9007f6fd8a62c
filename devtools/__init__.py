"""cellar.devtools: the tools room, at the top of the import graph.

Owns what a developer or an operator runs around a cluster rather than inside it: the local
cluster behind `cellar up` and the tests (`local_cluster`, its child processes in `children`),
the throwaway etcd launcher (`etcd_server`), `cellar token` (`token_cli`) and `cellar soak`
(random traffic under chaos, verified read by read). Benchmarks (`cellar.bench`) sit beside it
and may use it; nothing below imports it: the master, the nodes, the SDK and the adapters never
depend on a tool.

Must not: be imported by any other room except `cellar.bench` and the `cellar` command's lazy
table (`cellar.cli`), or hold logic a server needs at run time.
Import rule: must not import cellar.integrations.*, cellar.compat.*
"""
