"""`cellar soak`: random traffic from several client processes while a chaos loop breaks things.

What it owns
    A soak run: a `LocalCluster` with short liveness settings, N worker processes
    (`python -m cellar.devtools.soak --worker ...`) doing random put/upsert/get/remove (and puts
    without upsert of present keys, which must be refused) on their
    own key spaces, a chaos loop in this (parent) process injecting one fault at a time, a
    watcher thread polling the master's HTTP API, and the verdict at the end: exit 1 on any
    corrupt read or unexplained loss (and, with `--ha`, a leader stop no standby took over or a
    short etcd outage that deposed the leader).

Modules, in the order a run meets them
    - `settings`: the bounds, the short liveness settings, the fault kinds, the command line;
    - `values`: the self-describing value format every read is checked against;
    - `kinds`: which face and transport each worker's client is (four kinds by default);
    - `worker`: one client process and its model of what it had acknowledged;
    - `replicas`: where a worker's key is stored, asked after each acknowledged write;
    - `watcher`: the thread that records expiries, evictions and leader changes;
    - `chaos`: the faults, one at a time, each kind in turn, with their windows;
    - `report`: loss and stale-read causes, the JSON report, the summary;
    - `run`: `run_soak` and `main`, the parent that ties them together.
    `python -m cellar.devtools.soak` runs `main` (`__main__`); the workers are started that way.

What it must never do
    Run more than one fault at a time, wait without a bound, or leave a process behind (workers
    and cluster children die with this process, see `cellar.lifecycle`).
"""

from cellar.devtools.soak.run import main

__all__ = ["main"]
