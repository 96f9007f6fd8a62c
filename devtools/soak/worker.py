"""A soak worker: one client process of random operations on its own keys, every read checked.

What it runs
    Single put/upsert/get/remove steps and, at --batch-share, batched ones (get_many, put_many
    with and without upsert, remove_many of 2-MAX_BATCH_KEYS keys), through the face and on
    the transport --face and --transport name (kinds.py).

The model (what a worker knows)
    Every value is self-describing (`cellar.devtools.soak.values`), so any read is verified on
    its own. Each worker owns a disjoint key space and remembers, per key, what it last had
    acknowledged: an acknowledged put/upsert -> that version is expected; an acknowledged
    remove -> absent; a put without upsert of a present key refused (AlreadyExists) -> the
    version before it is still expected; an operation that raised (Unavailable, Timeout, ...)
    -> "unknown" until the next acknowledged write or remove. A read is then
    - CORRUPT when the digest, the key or the framing is wrong, or the version was never
      written (newer than any attempted): must never happen;
    - STALE when it returns an older version than the last acknowledged write, a newer one
      that was refused ("refused_write_stored"), or a value for a key whose removal was
      acknowledged ("resurrected");
    - a LOSS when it answers NotFound (or a remove answers False) for a key whose last
      acknowledged operation was a write.
    After each acknowledged write a worker asks the master where the replicas are (one
    GetReplicas whose pin rides on the next lookup), so a loss can be explained precisely.
    Its counts go to JSON files in the run's work directory, which the parent reads; after the
    parent marks the cluster settled, a final pass reads every key the worker believes present.

Started by the parent as `python -m cellar.devtools.soak --worker ...`; it dies with its parent
(`cellar.lifecycle`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from cellar.devtools.soak.kinds import open_client
from cellar.devtools.soak.replicas import ReplicaLocator
from cellar.devtools.soak.settings import (
    CLIENT_TIMEOUT_S,
    ERROR_SAMPLE_CHARS,
    ERROR_SAMPLES_PER_KIND,
    FINAL_PASS_ATTEMPTS,
    MAX_BATCH_KEYS,
    RECOVERY_TIMEOUT_S,
    SETTLE_TIMEOUT_S,
    STATS_INTERVAL_S,
)
from cellar.devtools.soak.values import check_value, make_value
from cellar.lifecycle import die_with_parent_if_asked

PRESENT, ABSENT, UNKNOWN = "present", "absent", "unknown"
INTO_BUDGETS_S = (None, 0.05, 0.5)  # get_many_into's timeout_s: none, a prefetch's, a loose one


def _digest(buffer: bytearray) -> int:
    return xxhash.xxh3_64_intdigest(buffer)


@dataclass
class KeyModel:
    state: str = ABSENT
    version: int = 0                 # the acknowledged version when PRESENT
    attempted: int = 0               # highest version ever attempted (any write)
    ack_time: float = 0.0            # wall time of the last acknowledged write
    nodes: list[str] | None = None   # replica node ids after the last acknowledged write
    removed_at: float = 0.0          # wall time of the last acknowledged remove
    removed_how: str = ""            # "<state before>:<what remove answered>"
    possible: set[int | None] = field(default_factory=set)  # UNKNOWN: what a read may return


class Worker:
    """One client process: random operations on its own keys, checked against its model."""

    def __init__(self, args: argparse.Namespace) -> None:
        import cellar  # the SDK only in workers: the parent never loads it

        self.cellar = cellar
        # errors a write gets before anything is written: the key's state holds
        self._refused_up_front = (cellar.NoSpace, cellar.QuotaExceeded, cellar.InvalidArgument)
        self.args = args
        self.dir = Path(args.dir)
        self.rng = random.Random(args.seed)
        self.keys = [f"soak/{args.run_id}/c{args.id}/k{i}" for i in range(args.keys)]
        self.model = {k: KeyModel() for k in self.keys}
        self.ops: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        # kind -> [(wall time, message)]: why the errors came (a count alone does not say)
        self.error_samples: dict[str, list[tuple[float, str]]] = {}
        self.stale: list[dict[str, Any]] = []
        self.corrupt: list[dict[str, Any]] = []
        self.losses: list[dict[str, Any]] = []
        self.unverified = 0
        self.bytes_written = 0
        self.bytes_read = 0
        self.client = open_client(cellar, args.face, args.transport, args.master,
                                  CLIENT_TIMEOUT_S)
        self._replicas = ReplicaLocator(args.master)
        # get_many_into's buffers (one per key of a batch, each of the largest value), and
        # (key, index, digest) of those a call gave up on, checked before the next one
        self._into_buffers = [bytearray(int(args.max_size)) for _ in range(MAX_BATCH_KEYS)]
        self._abandoned: list[tuple[str, int, int]] = []
        self._log_min = math.log(args.min_size)
        self._log_max = math.log(args.max_size)

    # -- one operation --

    def _size(self) -> int:
        if self.rng.random() < self.args.page_share:  # an engine's page: puts of one size
            return int(self.args.page_size)
        return int(math.exp(self.rng.uniform(self._log_min, self._log_max)))

    def _error(self, op: str, exc: BaseException) -> None:
        kind = f"{op}:{type(exc).__name__}"
        self.errors[kind] += 1
        samples = self.error_samples.setdefault(kind, [])
        message = str(exc)[:ERROR_SAMPLE_CHARS]
        if len(samples) < ERROR_SAMPLES_PER_KIND and all(m != message for _, m in samples):
            samples.append((time.time(), message))

    def step(self) -> None:
        if self.rng.random() < self.args.batch_share:
            self.batch_step()
            return
        key = self.rng.choice(self.keys)
        m = self.model[key]
        r = self.rng.random()
        if m.state == ABSENT:
            if r < 0.75:
                self.write(key, m, upsert=False)
            else:
                self.read(key, m)
        elif m.state == PRESENT:
            if r < 0.55:
                self.read(key, m)
            elif r < 0.80:
                self.write(key, m, upsert=True)
            elif r < 0.85:
                self.put_over(key, m)
            else:
                self.remove(key, m)
        else:
            if r < 0.4:
                self.read(key, m)
            elif r < 0.9:
                self.write(key, m, upsert=True)
            else:
                self.remove(key, m)

    def write(self, key: str, m: KeyModel, *, upsert: bool) -> None:
        op = "upsert" if upsert else "put"
        m.attempted += 1
        version = m.attempted
        value = make_value(key, version, self._size(), self.rng)
        self.ops[op] += 1
        before = self._possible(m)
        try:
            if upsert:
                self.client.upsert(key, value, replicas=self.args.replicas)
            else:
                self.client.put(key, value, replicas=self.args.replicas)
        except self.cellar.AlreadyExists as exc:
            # we believed the key absent: a removed value came back, or an earlier failed
            # write did land after all (then the key was UNKNOWN, not ABSENT)
            self._error(op, exc)
            self._came_back(key, m, before)
            return
        except self._refused_up_front as exc:
            self._error(op, exc)  # refused before anything was written: the state holds
            return
        except Exception as exc:
            self._error(op, exc)
            self._unknown(m, before | {version})
            return
        self._acknowledged(key, m, version, len(value))

    def _acknowledged(self, key: str, m: KeyModel, version: int, nbytes: int) -> None:
        """A write of `version` was acknowledged: it is what reads must return from now on."""
        self.bytes_written += nbytes
        m.state, m.version, m.ack_time, m.possible = PRESENT, version, time.time(), set()
        m.nodes = self._replicas.nodes_of(key)

    def put_over(self, key: str, m: KeyModel) -> None:
        """A put without upsert of a key whose value is acknowledged: refused (AlreadyExists),
        and the acknowledged version stays the one expected, through every fault after it (a
        refused write that a restarted master adopted would read as a newer version: STALE)."""
        op = "put_over"
        m.attempted += 1
        version = m.attempted
        value = make_value(key, version, self._size(), self.rng)
        self.ops[op] += 1
        try:
            self.client.put(key, value, replicas=self.args.replicas)
        except self.cellar.AlreadyExists:
            return
        except self._refused_up_front as exc:
            self._error(op, exc)
            return
        except Exception as exc:
            # unanswered: refused, or (a master killed between the node's seal of a put-ahead
            # write and its PutEnd, docs/security.md) stored
            self._error(op, exc)
            self._unknown(m, {m.version, version})
            return
        # Acknowledged over a present value: that same window, with the PutEnd answered by the
        # next master from the node's receipts. Counted, not failed; the new value is expected.
        self.errors[f"{op}:acknowledged_over_present_value"] += 1
        self._acknowledged(key, m, version, len(value))

    def remove(self, key: str, m: KeyModel) -> None:
        self.ops["remove"] += 1
        before = self._possible(m)
        try:
            existed = self.client.remove(key)
        except Exception as exc:
            self._error("remove", exc)
            self._unknown(m, before | {None})
            return
        self._removed(key, m, existed, "remove")

    def _removed(self, key: str, m: KeyModel, existed: bool, op: str) -> None:
        """A remove of `key` was acknowledged, answering whether it `existed`."""
        if m.state == PRESENT and not existed:
            self._loss(key, m, f"{op} returned False")
        m.removed_how = f"{m.state}:{existed}"
        m.state, m.possible, m.nodes, m.removed_at = ABSENT, set(), None, time.time()

    def read(self, key: str, m: KeyModel, *, final: bool = False) -> bool:
        """Read and judge `key`; False if the read itself failed (Unavailable, ...)."""
        self.ops["final_get" if final else "get"] += 1
        try:
            value = self.client.get(key)
        except self.cellar.NotFound:
            if m.state == PRESENT:
                self._loss(key, m, "get: NotFound")
                m.state, m.possible, m.nodes = ABSENT, set(), None
            elif m.state == UNKNOWN and None not in m.possible:
                self.errors["get:NotFound(unknown state)"] += 1
            return True
        except Exception as exc:
            self._error("final_get" if final else "get", exc)
            return False
        self._judge(key, m, value)
        return True

    def _judge(self, key: str, m: KeyModel, value: bytes) -> None:
        """Judge the value a read of `key` returned against what was acknowledged."""
        self.bytes_read += len(value)
        version, why = check_value(key, value)
        now = time.time()
        if version is None or version > m.attempted:
            why = why or f"version {version} was never written (highest attempted {m.attempted})"
            self.corrupt.append({"key": key, "t": now, "why": why, "size": len(value)})
            return
        if m.state == PRESENT and version < m.version:
            self.stale.append({"key": key, "kind": "older_version", "t": now,
                               "expected": m.version, "got": version, "ack_time": m.ack_time})
        elif m.state == PRESENT and version > m.version:  # only a refused put_over is newer
            self.stale.append({"key": key, "kind": "refused_write_stored", "t": now,
                               "expected": m.version, "got": version, "ack_time": m.ack_time})
            m.version = version  # reported once; the value now stored is what later reads see
        elif m.state == ABSENT:
            self.stale.append({"key": key, "kind": "resurrected", "t": now, "got": version,
                               "ack_time": m.removed_at, "removed": m.removed_how})
            self._unknown(m, {version})
        elif m.state == UNKNOWN and m.possible and version not in m.possible:
            newest = max((v for v in m.possible if v is not None), default=0)
            if version < newest:
                self.stale.append({"key": key, "kind": "older_version_unknown_state", "t": now,
                                   "possible": sorted(str(v) for v in m.possible),
                                   "got": version, "ack_time": max(m.ack_time, m.removed_at)})

    # -- batched operations: each key judged as its single operation would be --

    def batch_step(self) -> None:
        keys = self.rng.sample(self.keys, self.rng.randint(2, min(MAX_BATCH_KEYS, len(self.keys))))
        r = self.rng.random()
        if r < 0.25:
            self.read_many(keys)
        elif r < 0.45:
            self.read_many_into(keys)
        elif r < 0.75:
            self.write_many(keys, upsert=True)
        elif r < 0.90:
            self.write_many(keys, upsert=False)  # present keys: put_overs, refused one by one
        else:
            self.remove_many(keys)

    def write_many(self, keys: list[str], *, upsert: bool) -> None:
        """`put_many` of a new version of each key (all of one page size, at --page-share):
        OK acknowledges it; ALREADY_EXISTS must come only for a key not believed absent;
        a refusal before writing leaves the key as it was; anything else leaves it unknown."""
        op = "upsert_many" if upsert else "put_many"
        self.ops[op] += 1
        one_size = int(self.args.page_size) if self.rng.random() < self.args.page_share else 0
        items: list[tuple[str, bytes]] = []
        plans: list[tuple[str, KeyModel, int, set[int | None]]] = []
        for key in keys:
            m = self.model[key]
            m.attempted += 1
            items.append((key, make_value(key, m.attempted, one_size or self._size(), self.rng)))
            plans.append((key, m, m.attempted, self._possible(m)))
        try:
            statuses = self.client.put_many(items, replicas=self.args.replicas, upsert=upsert)
        except self._refused_up_front as exc:
            self._error(op, exc)
            return
        except Exception as exc:
            self._error(op, exc)
            for _key, m, version, before in plans:
                self._unknown(m, before | {version})
            return
        status = self.cellar.Status
        refused = (status.NO_SPACE, status.QUOTA_EXCEEDED, status.INVALID)
        for (key, m, version, before), (_, value), got in zip(plans, items, statuses, strict=True):
            if got == status.OK:
                if m.state == PRESENT and not upsert:  # the window put_over describes
                    self.errors[f"{op}:acknowledged_over_present_value"] += 1
                self._acknowledged(key, m, version, len(value))
            elif got == status.ALREADY_EXISTS and not upsert:
                if m.state == ABSENT:  # as `write`
                    self.errors[f"{op}:ALREADY_EXISTS"] += 1
                    self._came_back(key, m, before)
            else:
                self.errors[f"{op}:{got.name}"] += 1
                if got not in refused:  # a refusal before writing leaves the key as it was
                    self._unknown(m, before | {version})

    def read_many(self, keys: list[str]) -> None:
        """`get_many`: each value judged as a get's; a None (missing or unreadable: the call
        does not say which) proves nothing, so it is only counted."""
        self.ops["get_many"] += 1
        try:
            values = self.client.get_many(keys)
        except Exception as exc:
            self._error("get_many", exc)
            return
        for key, value in zip(keys, values, strict=True):
            m = self.model[key]
            if value is not None:
                self._judge(key, m, value)
            elif m.state == PRESENT:
                self.errors["get_many:None(present)"] += 1

    def read_many_into(self, keys: list[str]) -> None:
        """`get_many_into` as a prefetch makes it (a budget of INTO_BUDGETS_S, half with
        prefix=True) into this worker's own buffers: each size read judged as a get's value;
        with prefix=True every size kept must be a read (the leading run); and the buffer of
        every key it gave up on must not change after the call returned (checked before the
        buffers are used again: bytes landing there later would overwrite an engine's memory)."""
        self.ops["get_many_into"] += 1
        self._check_abandoned()
        prefix = self.rng.random() < 0.5
        budget_s = self.rng.choice(INTO_BUDGETS_S)
        buffers = self._into_buffers[:len(keys)]
        try:
            sizes = self.client.get_many_into(keys, buffers, timeout_s=budget_s, prefix=prefix)
        except Exception as exc:
            self._error("get_many_into", exc)
            return
        if len(sizes) > len(keys) or (not prefix and len(sizes) != len(keys)) or (
                prefix and any(size < 0 for size in sizes)):
            self.corrupt.append({"key": keys[0], "t": time.time(), "size": 0,
                                 "why": f"get_many_into(prefix={prefix}) of {len(keys)} keys "
                                        f"answered {sizes}"})
            return
        for i, (key, buffer) in enumerate(zip(keys, buffers, strict=True)):
            size = sizes[i] if i < len(sizes) else None  # None: after the prefix's cut
            if size is not None and size >= 0:
                self._judge(key, self.model[key], bytes(buffer[:size]))
                continue
            self._abandoned.append((key, i, _digest(buffer)))
            if size is not None and self.model[key].state == PRESENT:  # counted, not judged
                self.errors[f"get_many_into:{'LATE' if size == self.cellar.LATE else 'MISS'}"
                            "(present)"] += 1

    def _check_abandoned(self) -> None:
        for key, i, digest in self._abandoned:
            if _digest(self._into_buffers[i]) != digest:
                self.corrupt.append({"key": key, "t": time.time(), "size": 0,
                                     "why": "bytes landed in a buffer after get_many_into "
                                            "returned without reading into it"})
        self._abandoned = []

    def remove_many(self, keys: list[str]) -> None:
        self.ops["remove_many"] += 1
        befores = [self._possible(self.model[key]) for key in keys]
        try:
            existed = self.client.remove_many(keys)
        except Exception as exc:
            self._error("remove_many", exc)
            for key, before in zip(keys, befores, strict=True):
                self._unknown(self.model[key], before | {None})
            return
        for key, was in zip(keys, existed, strict=True):
            self._removed(key, self.model[key], was, "remove_many")

    # -- model helpers --

    @staticmethod
    def _possible(m: KeyModel) -> set[int | None]:
        if m.state == PRESENT:
            return {m.version}
        if m.state == ABSENT:
            return {None}
        return set(m.possible)

    @staticmethod
    def _unknown(m: KeyModel, possible: set[int | None]) -> None:
        m.state, m.possible, m.nodes = UNKNOWN, possible, None

    def _came_back(self, key: str, m: KeyModel, before: set[int | None]) -> None:
        """A put of `key`, believed absent, was refused AlreadyExists: a removed value came
        back, or an earlier failed write did land after all (then the key was UNKNOWN)."""
        self.stale.append({"key": key, "kind": "put_already_exists", "t": time.time(),
                           "expected": "absent", "ack_time": m.removed_at,
                           "removed": m.removed_how})
        self._unknown(m, before)

    def _loss(self, key: str, m: KeyModel, how: str) -> None:
        self.losses.append({"key": key, "version": m.version, "ack_time": m.ack_time,
                            "detect_time": time.time(), "nodes": m.nodes, "how": how})

    # -- the run --

    def stats(self) -> dict[str, Any]:
        return {
            "id": self.args.id, "face": self.args.face, "transport": self.args.transport,
            "ops": dict(self.ops), "errors": dict(self.errors),
            "error_samples": self.error_samples,
            "stale": len(self.stale), "corrupt": len(self.corrupt), "losses": len(self.losses),
            "bytes_written": self.bytes_written, "bytes_read": self.bytes_read,
            # writes under a put-ahead allocation (client/put_ahead.py), and single puts made
            # as one write and one PutEnd (client/one_put.py)
            "put_ahead": self._counted("aheads", "used"),
            "one_step_puts": self._counted("aheads", "one_step"),
            # gets read without asking, within the read trust (client/gets.py), and gets of
            # keys not known made as one lookup and one read (client/one_read.py)
            "trusted_reads": self._counted("locations", "trusted"),
            "one_step_lookups": self._counted("locations", "looked_up"),
            "early_commit_groups": self._early_commit_groups(),
        }

    def _early_commit_groups(self) -> int:
        """shm COMMIT groups sent while the rest of their batch was still copied
        (transfer/shm_commits.py) so far."""
        transports = getattr(getattr(getattr(self.client, "_s", None), "transports", None),
                             "transports", ())
        return sum(int(getattr(t, "stats", {}).get("early_commit_groups", 0)) for t in transports)

    def _counted(self, part: str, counter: str) -> int:
        """`counter` of the client session's `part` so far (0 when the client has none)."""
        held = getattr(getattr(self.client, "_s", None), part, None)
        return int(getattr(held, counter)) if held is not None else 0

    def _write_json(self, name: str, data: dict[str, Any]) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(self.dir / name)

    def run(self) -> int:
        next_stats = 0.0
        while time.time() < self.args.load_until:
            self.step()
            if time.monotonic() >= next_stats:
                self._write_json(f"stats-{self.args.id}.json", self.stats())
                next_stats = time.monotonic() + STATS_INTERVAL_S
        self._write_json(f"stats-{self.args.id}.json", self.stats())
        settled = self.dir / "settled"
        deadline = time.monotonic() + SETTLE_TIMEOUT_S + RECOVERY_TIMEOUT_S
        while not settled.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.final_pass()
        result = self.stats()
        result.update({"stale_reads": self.stale, "corrupt_reads": self.corrupt,
                       "lost": self.losses, "unverified": self.unverified,
                       "believed_present": sum(m.state == PRESENT for m in self.model.values()),
                       "unknown_at_end": sum(m.state == UNKNOWN for m in self.model.values())})
        self._write_json(f"result-{self.args.id}.json", result)
        self.client.close()
        self._replicas.close()
        return 0

    def final_pass(self) -> None:
        """Read every key believed present (and probe the removed ones for resurrection)."""
        self._check_abandoned()
        for key, m in self.model.items():
            if m.state == UNKNOWN:
                continue
            for attempt in range(FINAL_PASS_ATTEMPTS):
                if self.read(key, m, final=True):
                    break
                time.sleep(0.5 * (attempt + 1))
            else:
                self.unverified += 1


def worker_main(args: argparse.Namespace) -> int:
    die_with_parent_if_asked()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    return Worker(args).run()
