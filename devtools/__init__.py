"""cellar.devtools: the tools room, at the top of the import graph.

Owns what a developer or an operator runs around a cluster rather than inside it:
- `local_cluster`: `LocalCluster`, the cluster behind `cellar up` and the tests (a master or
  etcd + masters, and nodes, on one host; their faults; their credentials), and
  `cluster_argv`, the command lines of its children;
- `children`: one child process (`Child`), starting it, waiting for its ready line, stopping it;
- `etcd_server`: the throwaway single-member etcd of `cellar up --ha` and the HA tests;
- `ports`: free ports for the children, chosen below the kernel's ephemeral range;
- `up`: `cellar up`; `token_cli`: `cellar token`; `drain_cli`: `cellar node drain`;
  `tls_cli`: `cellar tls create` (a private CA and a certificate for compose and trials);
  `health_cli`: `cellar health` (the image's HEALTHCHECK, over https when its server serves it);
- `page_cache`: what of a file is in the page cache, and dropping it (cold reads for
  `make bench-disk` and the shm readahead test);
- `soak/`: `cellar soak`, random traffic under chaos verified read by read, one module per part:
  `settings` (bounds, fault kinds, the command line), `values` (the self-checking value
  format), `kinds` (each worker's face and transport), `worker` (one client process and its
  model), `replicas` (where its keys are), `watcher` (expiries, evictions, leader
  changes), `chaos` (one fault at a time), `report` (loss causes, the verdict), `run` (the
  parent and `main`; `python -m cellar.devtools.soak` runs it, and starts the workers so).
Benchmarks (`cellar.bench`) sit beside it and may use it; nothing below imports it: the master,
the nodes, the SDK and the adapters never depend on a tool.

Must not: be imported by any other room except `cellar.bench` and the `cellar` command's lazy
table (`cellar.cli`), or hold logic a server needs at run time.
Import rule: must not import cellar.integrations.*, cellar.compat.*
"""
