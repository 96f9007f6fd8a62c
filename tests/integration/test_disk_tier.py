"""The disk tier (docs/disk-tier.md): a node with 64 MiB of DRAM and a 512 MiB disk file.

400 x 1 MiB puts all read back byte-exact (most of them from disk), disk use never passes its
size by more than one object; a kill -9 of the node or of the master keeps every disk object
readable without a put; a disk object read twice within the window goes back to DRAM.
Negative control: the same 400 puts on the same node without `--disk-dir` lose most of them
(eviction), which is what the first test would see on the code before the disk tier.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

import cellar
from cellar.client import PutHints
from cellar.errors import Status
from cellar.proto.tiers import MOVE_COUNTERS, TIER_COUNTERS, moves_text
from cellar.storage_node.journal import replay
from cellar.units import format_size
from tests.support.http import post_json

MIB = 1 << 20
DRAM = 64 * MIB
DISK = 512 * MIB
COUNT = 400
DEMOTE_HIGH_WATERMARK = 0.80  # the master's default demote_high_watermark
MASTER_FLAGS = {"heartbeat_interval_s": 0.1, "tick_interval_s": 0.05, "node_suspect_after_s": 5,
                "node_expire_after_s": 30}


def _metric(cluster, name: str) -> float:
    with urllib.request.urlopen(cluster.http_url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    match = re.search(rf"^{name}(?:_total)? (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def _values(count: int, seed: int) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {f"page/{i:04d}": rng.integers(0, 256, MIB, dtype=np.uint8).tobytes()
            for i in range(count)}


def _wait(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def _disk_cluster(make_cluster, tmp_path, **flags):
    disk = tmp_path / "disk"
    disk.mkdir(exist_ok=True)
    return make_cluster(nodes=1, segment_size=DRAM,
                        node_flags={"disk_dir": str(disk), "disk_size": DISK},
                        **{**MASTER_FLAGS, **flags})


def _put_all(client, values: dict[str, bytes], status_of) -> int:
    """Put every value, one batch of 8 at a time; the most disk bytes seen in use."""
    keys = list(values)
    worst = 0
    for start in range(0, len(keys), 8):
        batch = {k: values[k] for k in keys[start:start + 8]}
        assert client.put_many(batch) == [Status.OK] * len(batch)
        worst = max(worst, status_of())
    return worst


def _dram_fraction(client) -> float:
    dram = [s for s in client.status()["segments"] if s["tier"] == "dram"]
    return sum(s["used_bytes"] for s in dram) / sum(s["size_bytes"] for s in dram)


def _disk_used(client) -> int:
    segments = client.status()["segments"]
    return sum(s["used_bytes"] for s in segments if s["tier"] == "disk")


@pytest.mark.timeout(180)
def test_400_pages_over_64mib_dram_all_read_back_most_from_disk(make_cluster, tmp_path):
    cluster = _disk_cluster(make_cluster, tmp_path)
    values = _values(COUNT, 22)
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        worst = _put_all(client, values, lambda: _disk_used(client))
        assert worst <= DISK + MIB + 4096, "disk use passed its size by more than one object"
        # lookup says where the run is served from: most of it on disk, the rest in DRAM
        found = client.lookup(list(values))
        assert found.prefix_len == COUNT and set(found.tiers) <= {"dram", "disk"}
        assert found.tiers["disk"].keys >= 300, found.tiers
        assert sum(run.keys for run in found.tiers.values()) == COUNT
        for start in range(0, COUNT, 16):
            keys = list(values)[start:start + 16]
            got = client.get_many(keys)
            assert [g == values[k] for k, g in zip(keys, got, strict=True)] == [True] * len(keys)
    disk_hits = _metric(cluster, "master_tier_disk_hits")
    print(f"\n400 x 1 MiB over 64 MiB DRAM + 512 MiB disk: {int(disk_hits)} reads from disk, "
          f"{int(_metric(cluster, 'master_tier_demotions'))} demotions, "
          f"{int(_metric(cluster, 'master_tier_spills'))} spills")
    assert disk_hits >= 300


@pytest.mark.timeout(180)
def test_two_replica_puts_past_every_nodes_dram_spill_to_disk_and_nothing_is_evicted(
        make_cluster, tmp_path):
    """Three nodes of 16 MiB DRAM with a disk tier each, 2-replica puts of 4 times all their
    DRAM: a replica no DRAM has room for goes to a disk (each replica on a node of its own),
    so nothing is evicted and every value reads back. Found by `cellar soak --disk-size`:
    only a 1-replica put spilled, a 2-replica put evicted DRAM objects, and the soak lost
    every one of them (12,303 in 40 s without a fault)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    # the longest tick: demotion (which makes DRAM room between puts) runs at most twice
    # during the burst, so most puts find DRAM full
    cluster = make_cluster(nodes=3, segment_size=16 * MIB,
                           node_flags={"disk_dir": str(disk), "disk_size": 256 * MIB},
                           **{**MASTER_FLAGS, "tick_interval_s": 5})
    values = _values(96, 7)  # 96 x 1 MiB x 2 replicas = 192 MiB against 48 MiB of DRAM
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        keys = list(values)
        for start in range(0, len(keys), 8):
            batch = {k: values[k] for k in keys[start:start + 8]}
            assert client.put_many(batch, replicas=2) == [Status.OK] * len(batch)
        for start in range(0, len(keys), 16):
            chunk = keys[start:start + 16]
            assert client.get_many(chunk) == [values[k] for k in chunk]
        on_disk = client.lookup(keys).tiers["disk"].keys
    assert _metric(cluster, "master_evicted_key_count") == 0
    spills = _metric(cluster, "master_tier_spills")
    print(f"\n96 x 1 MiB x 2 replicas over 3 x 16 MiB DRAM: {int(spills)} replicas spilled, "
          f"{on_disk} keys read from disk first")
    assert spills >= 48  # the burst is 4x all DRAM: at least a quarter of it spilled


@pytest.mark.timeout(180)
def test_without_disk_tier_the_same_puts_lose_most_pages(make_cluster):
    """The negative control of the test above: DRAM alone keeps under 64 of the 400. Without
    a disk tier the DRAM row still counts its traffic: every put written, every get a hit."""
    # read_trust_s 0: the key read twice is asked for twice (a trusted read counts no hit)
    cluster = make_cluster(nodes=1, segment_size=DRAM, **{**MASTER_FLAGS, "read_trust_s": 0})
    values = _values(COUNT, 22)
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        _put_all(client, values, lambda: 0)
        kept = [k for k in values if client.exists(k)]
        # eviction may still be running down to its low watermark: a get that finds nothing
        # is no hit, so the hits are the values read back, counted here
        found = []
        for start in range(0, len(kept), 16):
            chunk = kept[start:start + 16]
            got = client.get_many(chunk)
            assert all(g is None or g == values[k] for k, g in zip(chunk, got, strict=True))
            found += [k for k, g in zip(chunk, got, strict=True) if g is not None]
        assert found
        last = found[-1]  # just read: the most recently used, not the next one evicted
        assert client.get(last) == values[last]  # one key twice: two hits
        reads = len(found) + 1
        tiers = client.status()["tiers"]
    assert len(kept) < 64
    assert set(tiers) == {"dram"}
    assert {k: tiers["dram"][k] for k in TIER_COUNTERS} == {
        "hits": reads, "read_bytes": reads * MIB, "write_bytes": COUNT * MIB}
    for what in TIER_COUNTERS:
        assert _metric(cluster, f'master_tier_{what}_total{{tier="dram"}}') == tiers["dram"][what]


@pytest.mark.timeout(240)
def test_disk_objects_survive_kill_9_of_node_and_of_master(make_cluster, tmp_path):
    cluster = _disk_cluster(make_cluster, tmp_path)
    values = _values(160, 5)
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        _put_all(client, values, lambda: 0)
        _wait(lambda: _metric(cluster, "master_tier_demotions") > 0)
        # measured once the demotions are done: a move still in flight has its target range
        # allocated (counted as used) but not sealed, and a kill -9 drops it (CI saw the disk
        # come back below a figure that counted such ranges)
        _wait(lambda: _dram_fraction(client) <= DEMOTE_HIGH_WATERMARK
              and _metric(cluster, "master_tier_moves_pending") == 0)
        on_disk = _disk_used(client)
        assert on_disk >= 64 * MIB
        moved = _metric(cluster, "master_tier_demotions") - _metric(cluster,
                                                                    "master_tier_disk_evictions")
    cluster.restart_node(0)  # kill -9, same --node-id and disk dir
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        _wait(lambda: _disk_used(client) >= on_disk)
        keys = list(values)
        for start in range(0, len(keys), 16):
            chunk = keys[start:start + 16]
            got = client.get_many(chunk)
            for k, g in zip(chunk, got, strict=True):
                assert g is None or g == values[k], k
        # every object the disk held came back without a put
        assert _disk_used(client) >= on_disk
    # each demoted copy came back with the put of its value (journal kind 4), which is how a
    # rebuilt master orders it against a later put of its key (ReportedObject.value_alloc_id)
    (journal,) = (tmp_path / "disk").glob("cellar-*.idx")
    copies = [e for e in replay(journal.read_bytes())[0].values() if e.value_id]
    assert len(copies) >= moved > 0 and all(e.value_id < e.alloc_id for e in copies)
    cluster.restart_master()
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        _wait(lambda: _disk_used(client) >= on_disk)
        present = 0
        for start in range(0, len(keys), 16):
            chunk = keys[start:start + 16]
            for k, g in zip(chunk, client.get_many(chunk), strict=True):
                assert g is None or g == values[k], k
                present += g is not None
        assert present * MIB >= on_disk


@pytest.mark.timeout(180)
def test_a_same_host_client_moves_disk_replicas_over_shm(make_cluster, tmp_path):
    """The disk file is offered over shm like a DRAM segment: a same-host client's spilled puts
    are copied into it and its reads copied out of it through the client's own mapping (none
    over the node's TCP port), byte-exact; after a kill -9 of the node, which re-attaches the
    same file, the same client reads them again by shm without a put. (On the code before, the
    disk tier had no shm endpoint: every one of these went by TCP and the shm counts stay 0.)"""
    disk = tmp_path / "disk"
    disk.mkdir()
    cluster = make_cluster(nodes=1, segment_size=4 * MIB, **MASTER_FLAGS,
                           node_flags={"disk_dir": str(disk), "disk_size": 64 * MIB})
    values = _values(24, 7)
    keys = list(values)
    with cellar.connect(cluster.address, timeout_s=30) as client:  # auto: shm before tcp
        shm = next(t for t in client._transports.transports if t.name == "shm")
        client.put("filler", bytes(4 * MIB), soft_pin=True)  # all of DRAM: every put spills
        writes = shm.stats["writes"]
        assert client.put_many(values) == [Status.OK] * len(values)
        assert shm.stats["writes"] - writes == len(values)
        # each value was hashed by its copy into the mapping, not beforehand (client/flows.py)
        assert client._s.writes_fused
        found = client.lookup(keys)
        assert found.prefix_len == len(keys) and found.tiers["disk"].keys == len(keys)
        hits, reads = _metric(cluster, "master_tier_disk_hits"), shm.stats["reads"]
        got = client.get_many(keys)
        assert [g == values[k] for k, g in zip(keys, got, strict=True)] == [True] * len(keys)
        assert shm.stats["reads"] - reads == len(keys)
        assert _metric(cluster, "master_tier_disk_hits") - hits == len(keys)
        cluster.restart_node(0)  # kill -9; the same --node-id and disk dir
        _wait(lambda: client.lookup(keys).prefix_len == len(keys))
        reads = shm.stats["reads"]
        got = client.get_many(keys)
        assert [g == values[k] for k, g in zip(keys, got, strict=True)] == [True] * len(keys)
        assert shm.stats["reads"] - reads == len(keys)
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as remote:
        assert remote.put_many({"remote/0": values[keys[0]]}) == [Status.OK]
        assert not remote._s.writes_fused  # hashed behind PutStart, as before
        assert remote.get("remote/0") == values[keys[0]]


@pytest.mark.timeout(180)
def test_disk_object_read_twice_in_window_is_promoted(make_cluster, tmp_path):
    """The switch back to DRAM does not wait for readers: the second read's pin is never
    released here (as for a key read continuously, whose pins overlap), yet the object is
    promoted. Negative control: on 3075c0f the switch waited for no pins and this timed out."""
    cluster = _disk_cluster(make_cluster, tmp_path, pin_ttl_s=120)
    values = _values(120, 9)
    with (cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client,
          cellar.connect(cluster.address, timeout_s=30, transport="tcp") as holder):
        _put_all(client, values, lambda: 0)
        _wait(lambda: _dram_fraction(client) <= 0.80)  # demoted to the watermark: room for one
        first = next(iter(values))  # the oldest page: demoted first
        disk_hits = _metric(cluster, "master_tier_disk_hits")
        assert client.get(first) == values[first]
        assert _metric(cluster, "master_tier_disk_hits") == disk_hits + 1, "not read from disk"
        assert _metric(cluster, "master_tier_promotions") == 0
        holder._s.unpins.add = lambda ids: False  # this reader keeps its pins (until their TTL)
        assert holder.get(first) == values[first]  # the second read within the window
        _wait(lambda: _metric(cluster, "master_tier_promotions") == 1)
        assert client.status()["tiers"]["disk"]["promotions"] == 1  # ClusterStatus: the same
        disk_hits = _metric(cluster, "master_tier_disk_hits")
        assert client.get(first) == values[first]
        assert _metric(cluster, "master_tier_disk_hits") == disk_hits, "read from disk again"


@pytest.mark.timeout(180)
def test_lookup_and_the_prefix_query_split_the_run_by_tier(make_cluster, tmp_path):
    """Pages demoted to disk count under "disk" in `lookup` and under "DISK" in Mooncake's
    prefix query (which asks the engine-hash index, not the keys): the same split both ways.
    Negative control: before the query split its run it answered DISK 0 here."""
    cluster = _disk_cluster(make_cluster, tmp_path)
    values = _values(60, 17)  # above the high watermark, never full: the oldest go to disk
    keys = list(values)
    hashes = {key: (i + 1) * 7_919_000_003 for i, key in enumerate(keys)}
    token = cluster.token_for("pages")
    with cellar.connect(cluster.address, tenant="pages", token=token, timeout_s=30,
                        transport="tcp") as client:
        for start in range(0, len(keys), 8):
            batch = {k: values[k] for k in keys[start:start + 8]}
            assert client.put_many(batch, hints=PutHints(
                engine_hashes={k: hashes[k] for k in batch})) == [Status.OK] * len(batch)
        # demotion runs down to the low watermark over a few ticks, then nothing moves: both
        # answers below must see the same tiers, so wait until no move has started for 1 s
        seen: list[float] = []

        def settled() -> bool:
            seen.append(_metric(cluster, "master_tier_demotions"))
            return (len(seen) > 20 and seen[-1] == seen[-21] > 0
                    and _metric(cluster, "master_tier_moves_pending") == 0)

        _wait(settled)
        found = client.lookup(keys)
        body = {"model": "m", "seq_hashes": [hashes[k] for k in keys], "block_size": 16}
        status, reply = post_json(cluster, "/query_by_hash", body, token)
    assert found.prefix_len == len(keys) and set(found.tiers) == {"dram", "disk"}
    assert status == 200
    matched = reply["pages"]["cellar"]
    assert matched["longest_matched"] == 16 * len(keys)
    assert matched["DISK"] == 16 * found.tiers["disk"].keys > 0
    assert matched["CPU"] == 16 * found.tiers["dram"].keys > 0


@pytest.mark.timeout(180)
def test_a_budgeted_prefix_get_counts_a_slow_disk_replica_late(make_cluster, tmp_path):
    """get_many_into(timeout_s=, prefix=True) does not start a disk read the client expects
    to miss the budget: the run stops there (LATE) instead of holding the prefetch. Negative
    control: the same call from a client with no slow disk measured reads all three."""
    cluster = _disk_cluster(make_cluster, tmp_path)
    values = _values(60, 13)  # 60 MiB: above the high watermark, never full (no spill)
    keys = list(values)
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        _put_all(client, values, lambda: 0)
        _wait(lambda: _metric(cluster, "master_tier_demotions") > 0
              and _dram_fraction(client) <= 0.80)
        node_id = client.status()["nodes"][0]["node_id"]
        client._s.disk_rates.observe(node_id, MIB, 10.0)  # this client saw 100 KiB/s from it
        wanted = [keys[-1], keys[0], keys[-2]]  # DRAM, disk (the oldest, demoted), DRAM
        buffers = [bytearray(MIB) for _ in wanted]
        assert client.get_many_into(wanted, buffers, timeout_s=5.0, prefix=True) == [MIB]
        assert client.get_many_into(wanted, buffers, timeout_s=5.0) == [MIB, cellar.LATE, MIB]
        assert bytes(buffers[2]) == values[keys[-2]]
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as fresh:
        assert fresh.get_many_into(wanted, buffers, timeout_s=5.0, prefix=True) == [MIB] * 3
        assert [bytes(b) for b in buffers] == [values[k] for k in wanted]


def _node_metric(cluster, pattern: str) -> float:
    """A sample of node 0's /metrics (the node's http address from its log)."""
    log = cluster.nodes[0].log_path.read_text(errors="replace")
    found = re.findall(r"serving tcp \S+ \(http (\S+?),", log)
    assert found and found[-1] != "off", "the node serves no /metrics"
    with urllib.request.urlopen(f"http://{found[-1]}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    match = re.search(rf"^{pattern} (\S+)$", text, re.M)
    assert match, f"{pattern} not in the node's /metrics"
    return float(match.group(1))


@pytest.mark.timeout(180)
def test_tiers_shown_apart_and_a_truncated_disk_file_dropped_not_served(make_cluster, tmp_path):
    """ClusterStatus (client.status), `cellar status`, /api/v1/status, the status page and
    /metrics show DRAM and disk apart, use and traffic: hits and bytes read are the gets made
    here, counted in the tier each was served from, bytes written are the puts' and the
    moves', the same counters on every face; a disk file truncated while the node is down is
    dropped with its objects (none served, the node's node_corrupt_dropped counts it), DRAM
    survives."""
    disk = tmp_path / "disk"
    disk.mkdir()
    cluster = make_cluster(nodes=1, segment_size=DRAM, **MASTER_FLAGS,
                           node_flags={"disk_dir": str(disk), "disk_size": DISK,
                                       "http": "127.0.0.1:0"})
    values = _values(100, 3)
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        _put_all(client, values, lambda: 0)
        _wait(lambda: _dram_fraction(client) <= 0.80
              and _metric(cluster, "master_tier_moves_pending") == 0)
        tiers = client.status()["tiers"]
        assert set(tiers) == {"dram", "disk"}
        assert (tiers["dram"]["capacity_bytes"], tiers["disk"]["capacity_bytes"]) == (DRAM, DISK)
        assert tiers["disk"]["objects"] > 0
        assert tiers["dram"]["objects"] + tiers["disk"]["objects"] == len(values)
        for name in ("dram", "disk"):
            assert _metric(cluster, f'master_tier_objects{{tier="{name}"}}') == tiers[name]["objects"]
            assert _metric(cluster, f'master_tier_used_bytes{{tier="{name}"}}') == \
                tiers[name]["used_bytes"]
        # no get yet (lookup counts no hit): nothing read from either tier; every put written
        moves = {name: int(_metric(cluster, f"master_tier_{name}")) for name in MOVE_COUNTERS}
        assert moves["demotions"] > 0 and moves["promotions"] == moves["disk_evictions"] == 0
        assert [tiers[name]["hits"] for name in ("dram", "disk")] == [0, 0]
        assert tiers["disk"]["write_bytes"] == (moves["demotions"] + moves["spills"]) * MIB
        assert tiers["dram"]["write_bytes"] == (len(values) - moves["spills"]) * MIB
        # hits and bytes per tier: one read from each tier moves exactly its own counters
        tier_of = {key: next(iter(client.lookup([key]).tiers)) for key in values}
        on_disk = [key for key, tier in tier_of.items() if tier == "disk"]
        in_dram = [key for key, tier in tier_of.items() if tier == "dram"]
        assert (len(on_disk), len(in_dram)) == (tiers["disk"]["objects"], tiers["dram"]["objects"])
        oldest, newest = on_disk[0], in_dram[-1]
        before = {(what, name): _metric(cluster, f'master_tier_{what}_total{{tier="{name}"}}')
                  for what in ("hits", "read_bytes", "write_bytes") for name in ("dram", "disk")}
        assert before["write_bytes", "dram"] + before["write_bytes", "disk"] >= len(values) * MIB
        assert before["write_bytes", "disk"] >= tiers["disk"]["objects"] * MIB
        assert client.get(oldest) == values[oldest] and client.get(newest) == values[newest]
        for name in ("dram", "disk"):
            assert _metric(cluster, f'master_tier_hits_total{{tier="{name}"}}') == \
                before["hits", name] + 1
            assert _metric(cluster, f'master_tier_read_bytes_total{{tier="{name}"}}') == \
                before["read_bytes", name] + MIB
        # more reads, counted here: each disk key once (a second read would promote it)
        disk_reads, dram_reads = on_disk[1:6], in_dram[:3] * 2
        got = client.get_many(disk_reads + dram_reads)
        assert got == [values[k] for k in disk_reads + dram_reads]
        hits = {"disk": 1 + len(disk_reads), "dram": 1 + len(dram_reads)}
        status = client.status()
        tiers = status["tiers"]
        for name in ("dram", "disk"):
            row = tiers[name]
            assert (row["hits"], row["read_bytes"]) == (hits[name], hits[name] * MIB), (name, row)
            for what in TIER_COUNTERS:
                assert _metric(cluster, f'master_tier_{what}_total{{tier="{name}"}}') == row[what]
        assert _metric(cluster, "master_tier_disk_hits") == tiers["disk"]["hits"]
        assert {name: tiers["disk"][name] for name in MOVE_COUNTERS} == moves  # reads move nothing
        assert "demotions" not in tiers["dram"]
        assert tiers["dram"]["write_bytes"] + tiers["disk"]["write_bytes"] >= len(values) * MIB
        with urllib.request.urlopen(cluster.http_url + "/api/v1/status", timeout=10) as reply:
            http_tiers = json.loads(reply.read())["tiers"]
        assert http_tiers["disk"]["objects"] == tiers["disk"]["objects"]
        for name in ("dram", "disk"):
            counted = (*TIER_COUNTERS, *(MOVE_COUNTERS if name == "disk" else ()))
            assert {k: http_tiers[name][k] for k in counted} == {k: tiers[name][k] for k in counted}
        with urllib.request.urlopen(cluster.http_url + "/", timeout=10) as reply:
            page = reply.read().decode()
        assert "<table id=tiers>" in page
        cells = re.search(r'<tr data-tier="disk">(?:<td>.*?</td>){5}<td>(\d+)</td><td>([^<]+)</td>'
                          r"<td>([^<]+)</td></tr>", page)
        assert cells and cells.groups() == (str(hits["disk"]), format_size(hits["disk"] * MIB),
                                            format_size(tiers["disk"]["write_bytes"])), page
        assert f"<div class=sub id=tier-moves>{moves_text(tiers['disk'])}</div>" in page
        # `cellar status`, a process of its own (the cluster's credentials file: no flag)
        out = subprocess.run([sys.executable, "-m", "cellar", "status", "--master", cluster.address],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert re.search(r"^TIER\s+SEGMENTS\s+CAPACITY\s+USED\s+USE\s+OBJECTS\s+HITS\s+READ\s+"
                         r"WRITTEN$", out.stdout, re.M), out.stdout
        for name, capacity in (("dram", "64MiB"), ("disk", "512MiB")):
            row = tiers[name]
            assert re.search(rf"^{name}\s+1\s+{capacity}\s+\S+\s+\S+%\s+{row['objects']}\s+"
                             rf"{hits[name]}\s+{re.escape(format_size(hits[name] * MIB))}\s+"
                             rf"{re.escape(format_size(row['write_bytes']))}$", out.stdout, re.M), \
                out.stdout
        moved = (f"disk moves: demotions {moves['demotions']}, promotions 0, disk evictions 0, "
                 f"spills {moves['spills']}")
        assert moved in out.stdout.splitlines(), out.stdout
        top = subprocess.run([sys.executable, "-m", "cellar", "top", "--once", "--http",
                              cluster.http_url.removeprefix("http://")],
                             capture_output=True, text=True, timeout=60)
        assert top.returncode == 0, top.stderr
        assert re.search(rf"^disk\s.*%\s+{hits['disk']}\s+{re.escape(format_size(hits['disk'] * MIB))}"
                         rf"\s+{re.escape(format_size(tiers['disk']['write_bytes']))}$",
                         top.stdout, re.M), top.stdout
        assert moved in top.stdout.splitlines(), top.stdout
        on_dram = tiers["dram"]["objects"]
    assert _node_metric(cluster, 'node_corrupt_dropped_total{segment="\\d+",tier="disk",what="file"}') == 0
    (disk_file,) = disk.glob("*.seg")
    cluster.restart_node(0, before_start=lambda: os.truncate(disk_file, DISK // 2))
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        _wait(lambda: len(client.status()["segments"]) == 2)
        keys = list(values)
        got = [g for start in range(0, len(keys), 16) for g in client.get_many(keys[start:start + 16])]
        assert all(g is None or g == values[k] for k, g in zip(keys, got, strict=True))
        assert sum(g is not None for g in got) == on_dram, "a dropped disk object was served"
        assert client.status()["tiers"]["disk"]["objects"] == 0
    assert _node_metric(cluster, 'node_corrupt_dropped_total{segment="\\d+",tier="disk",what="file"}') == 1
