"""SGLang's prefetch stop policies over Cellar with a storage node slowed on purpose (SIGSTOP):
under `timeout` the backend's deadline-bounded batch_get_v1 returns while the node is still
stopped, with the leading pages that landed, every one of them exact; `wait_complete` (after the
node resumes) returns every page."""

from __future__ import annotations

import signal

from sglang_harness import Engine, Shape

PAGES, PREFIX_PAGES, SEED = 24, 4, 31
# The backend's own budget (SGLang's timeout policy values are base + per 1024 tokens). The
# scheduler-side timeout is far longer: if the backend waited for the stopped node, the
# scheduler would cut the prefetch with nothing acked and the prefix check below would fail.
BACKEND_BUDGET_S = 3.0  # roomy: the prefix pages must land within it on a loaded 2-core VM
SCHEDULER_TIMEOUT_S = 25.0


def test_timeout_policy_returns_the_exact_prefix_then_wait_complete_gets_all(fresh_cluster) -> None:
    # No ramp for a new node: the empty node 1 is then the freest segment and takes the tail.
    cluster = fresh_cluster(nodes=1, new_node_ramp_s=0)
    extra = {"transport": "tcp", "get_timeout_base_s": BACKEND_BUDGET_S,
             "get_timeout_per_ki_token_s": 0.0}
    engine = Engine(cluster.address, model="policy", shape=Shape(layout="layer_first"),
                    extra=extra)
    try:
        # The first pages live on node 0 only; the rest go to the new (freest) node 1.
        assert engine.backup(PAGES, SEED, first=PREFIX_PAGES) == PREFIX_PAGES * 16
        cluster.add_node()
        assert engine.backup(PAGES, SEED) == PAGES * 16
        engine.wipe()
        cluster.signal_node(1, signal.SIGSTOP)
        try:
            got = engine.prefetch(PAGES, SEED, policy="timeout", timeout_s=SCHEDULER_TIMEOUT_S)
            assert got.hit_pages == PAGES  # batch_exists asks the master only
            assert not got.terminated, "batch_get_v1 did not return within its own budget"
            assert PREFIX_PAGES <= got.completed_pages < PAGES
            assert engine.exact_pages(got.host_indices, SEED, got.completed_pages) == \
                got.completed_pages
        finally:
            cluster.signal_node(1, signal.SIGCONT)
        engine.host.free(got.host_indices)
        full = engine.prefetch(PAGES, SEED, policy="wait_complete")
        assert (full.hit_pages, full.completed_pages) == (PAGES, PAGES)
        assert engine.exact_pages(full.host_indices, SEED, PAGES) == PAGES
    finally:
        engine.close()
