"""Outages under SGLang's real HiCacheController: a storage node or the master killed (kill -9)
while prefetches run. The engine sees misses or a shorter prefix, never an exception from the
backend, never wrong bytes, and gets its pages back when the cluster recovers."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import pytest
from sglang_harness import Engine, PrefetchResult, Shape

PAGES, SEED = 16, 41
# Short SDK deadlines so that calls into a dead master or node fail fast (they are misses).
EXTRA = {"transport": "tcp", "timeout_s": 3.0, "get_timeout_base_s": 2.0}


class Prefetcher(threading.Thread):
    """Prefetch the same sequence again and again (as requests would) and check every result:
    each page reported filled must hold exactly its bytes."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(daemon=True)
        self.engine = engine
        self.stop = threading.Event()
        self.results: list[PrefetchResult] = []
        self.wrong: list[str] = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                got = self.engine.prefetch(PAGES, SEED)
                if got.completed_pages:
                    exact = self.engine.exact_pages(got.host_indices, SEED, got.completed_pages)
                    if exact != got.completed_pages:
                        self.wrong.append(f"{got.completed_pages} pages reported, {exact} exact")
                if got.host_indices is not None:
                    self.engine.host.free(got.host_indices)
                self.results.append(got)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.errors.append(e)


def backend_exceptions(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Exceptions that reached SGLang's controller threads (it logs them with a traceback)."""
    return [r.getMessage() for r in caplog.records
            if r.exc_info and r.name.startswith("sglang")]


def run_outage(caplog: pytest.LogCaptureFixture, engine: Engine, kill, recover) -> None:
    assert engine.backup(PAGES, SEED) == PAGES * 16
    engine.wipe()
    worker = Prefetcher(engine)
    worker.start()
    try:
        _wait_for(lambda: len(worker.results) >= 2, worker)
        kill()
        seen = len(worker.results)
        _wait_for(lambda: len(worker.results) >= seen + 2, worker)  # prefetches during the outage
        during = worker.results[seen:]
        recover()
        _wait_for(lambda: any(r.completed_pages == PAGES for r in worker.results[seen + 2:]), worker)
    finally:
        worker.stop.set()
        worker.join(120)
    assert not worker.errors, worker.errors
    assert not worker.wrong, worker.wrong
    assert backend_exceptions(caplog) == []
    assert any(r.completed_pages < PAGES for r in during)  # the outage was seen, as misses


def _wait_for(cond, worker: Prefetcher, timeout_s: float = 120.0) -> None:
    import time

    end = time.monotonic() + timeout_s
    while not cond():
        assert worker.is_alive() or worker.stop.is_set(), worker.errors
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.05)


@pytest.fixture
def outage(fresh_cluster, caplog: pytest.LogCaptureFixture):
    """(cluster, engine) for one outage test; the engine is closed after it."""
    caplog.set_level(logging.WARNING)
    cluster = fresh_cluster(nodes=2)
    engines: list[Engine] = []

    def make(model: str, layout: str) -> tuple[Any, Engine]:
        engines.append(Engine(cluster.address, model=model, shape=Shape(layout=layout),
                              extra=EXTRA))
        return cluster, engines[-1]

    yield make
    for engine in engines:
        engine.close()


def test_node_killed_mid_prefetch(outage, caplog: pytest.LogCaptureFixture) -> None:
    cluster, engine = outage("outage-node", "page_first")

    def kill() -> None:
        # Held mid-read first, so the kill lands while a batch_get_v1 waits on this node.
        cluster.signal_node(0, signal.SIGSTOP)
        cluster.kill_node(0)

    # Same identity and segment file on restart: it re-attaches the objects it held.
    run_outage(caplog, engine, kill, lambda: cluster.restart_node(0))


def test_master_killed_mid_prefetch(outage, caplog: pytest.LogCaptureFixture) -> None:
    cluster, engine = outage("outage-master", "layer_first")
    # A restarted master rebuilds its table from the nodes' indexes (same port).
    run_outage(caplog, engine, lambda: cluster.kill_master(), lambda: cluster.restart_master())
