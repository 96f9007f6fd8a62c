"""The election's leader watch (coord/election.py `_watch_leader`) against a real etcd.

It is a stream of Cellar's own since 2026-12-06: etcd3aio's `watch` left a grpc.aio task
behind for every stream etcd cut, destroyed pending at the session's end and logged as asyncio
ERRORs. The watch must still see every change of the leader key, and see them again after
etcd was stopped and started under it.
"""

from __future__ import annotations

import asyncio

from cellar.coord.election import LeaderElection
from cellar.coord.target import LeaderRecord, parse_etcd_url
from cellar.devtools.etcd_server import EtcdServer

WAIT_S = 10.0


def test_the_leader_watch_sees_changes_before_and_after_an_etcd_restart(tmp_path):
    from etcd3aio import Etcd3Client

    with EtcdServer(data_dir=tmp_path / "etcd", log_path=tmp_path / "etcd.log") as etcd:
        target = parse_etcd_url(etcd.etcd_url("watched"))
        election = LeaderElection(target, LeaderRecord("m0", "127.0.0.1:1", "127.0.0.1:2", 0),
                            lease_ttl_s=3, etcd_timeout_s=1.0, on_elected=lambda epoch: None,
                            on_deposed=lambda reason: None, on_leader=lambda record: None)

        async def scenario() -> None:
            client = Etcd3Client(list(target.endpoints), rpc_max_attempts=1)
            await client.connect()
            watching = asyncio.create_task(election._watch_leader(client))
            try:
                for round_ in range(2):
                    if round_:  # etcd goes away under the watch and comes back
                        await asyncio.to_thread(etcd.stop)
                        await asyncio.sleep(0.5)
                        await asyncio.to_thread(etcd.start)
                    for i in range(3):
                        election._changed.clear()
                        deadline = asyncio.get_running_loop().time() + WAIT_S
                        while not election._changed.is_set():
                            try:  # the watch may still be reopening: put again until seen
                                await client.kv.put(target.leader_key, f"v{round_}.{i}",
                                                    timeout=1.0)
                            except Exception:  # noqa: BLE001 - etcd still starting
                                pass
                            try:
                                await asyncio.wait_for(election._changed.wait(), 0.5)
                            except asyncio.TimeoutError:
                                assert asyncio.get_running_loop().time() < deadline, \
                                    f"round {round_}: change {i} never seen"
                # no grpc.aio request-generator task left behind by the stream etcd cut
                leaked = [t for t in asyncio.all_tasks()
                          if "_consume_request_iterator" in repr(t.get_coro())]
                assert leaked == [], leaked
            finally:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
                await client.close()

        asyncio.run(scenario())
