"""`lookup`: what the cache holds of a prefix, what loading it would cost this client, and
whether loading beats recomputing it.

One Lookup RPC per `max_batch_keys` keys (one fast-line round trip for any engine's request:
256 keys within 0.3 ms on loopback, like `prefix_len`), answering the leading run stored and
readable, per tier, in bytes (master/lookup.py). This module adds what only the client knows:
the estimated time to load that run into this client, from its own measured round trip and read
throughput (client/load_costs.py), and, when the caller gives its prefill rate and tokens per
key, the advice of `cellar.advice` (load when the prefill time saved exceeds the load time).

The flow never pins, never moves payload bytes, and never reads a clock to wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cellar.advice import MAX_TOKENS_PER_KEY, advise, check_rate
from cellar.client.checks import batch_ranges, validate_keys
from cellar.client.flows import Flow, Record, Rpc, Session
from cellar.errors import CellarError
from cellar.proto import cellar_pb2 as pb


@dataclass(frozen=True, slots=True)
class TierRun:
    keys: int      # keys of the leading run read from this tier
    nbytes: int    # their payload bytes


@dataclass(frozen=True, slots=True)
class LookupResult:
    """What `Client.lookup` answers (all times in seconds, sizes in bytes)."""

    keys: int                            # keys asked about
    prefix_len: int                      # leading keys stored and readable, any tier
    prefix_bytes: int                    # their payload bytes
    tiers: dict[str, TierRun] = field(default_factory=dict)  # "dram" (| "disk") -> run
    load_s: float = 0.0                  # estimated time to load the run into this client
    rtt_s: float = 0.0                   # the metadata round trip the estimate assumes
    bytes_per_s: float = 0.0             # the read throughput it assumes
    transport: str = ""                  # whose throughput ("" before any read)
    basis: str = "prior"                 # "measured" | "prior" (no read measured yet)
    tokens_reused: int | None = None     # prefix_len * tokens_per_key, when given
    prefill_saved_s: float | None = None  # tokens_reused / prefill_tokens_per_s, when given
    advice: str | None = None            # "load" | "recompute", when a prefill rate is given

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__ if name != "tiers"}
        out["tiers"] = {t: {"keys": r.keys, "bytes": r.nbytes} for t, r in self.tiers.items()}
        return out


def lookup_flow(s: Session, keys: Sequence[Any], prefill_tokens_per_s: float | None,
                tokens_per_key: int | None) -> Flow[LookupResult]:
    check_rate(prefill_tokens_per_s, tokens_per_key)
    names = validate_keys(keys, s.limits.max_key_bytes)
    deadline = s.deadline()
    count, nbytes = 0, 0
    tiers: dict[str, list[int]] = {}
    for span in batch_ranges(len(names), s.limits.max_batch_keys):
        chunk = names[span.start:span.stop]
        reply = yield Rpc("Lookup", pb.KeysRequest(header=s.header, keys=chunk), deadline)
        n = int(reply.prefix_len)
        tier_keys = sum(t.keys for t in reply.tiers)
        if not 0 <= n <= len(chunk) or tier_keys != n or sum(t.bytes for t in reply.tiers) \
                != reply.prefix_bytes or len(reply.tiers) > 8:
            raise CellarError(f"Lookup: master answered {n} keys ({tier_keys} by tier) for "
                              f"{len(chunk)} keys")
        count += n
        nbytes += int(reply.prefix_bytes)
        for t in reply.tiers:
            entry = tiers.setdefault(t.tier, [0, 0])
            entry[0] += t.keys
            entry[1] += t.bytes
        if n < len(chunk):
            break
    yield Record(len(names), count, 0, tokens_per_key=tokens_per_key or s.tokens_per_key)
    est = s.costs.estimate(nbytes)
    tokens = saved = advice = None
    if tokens_per_key is not None:
        tokens = count * tokens_per_key
    if prefill_tokens_per_s is not None and tokens_per_key is not None:
        verdict = advise(count, est.load_s, prefill_tokens_per_s, tokens_per_key)
        saved, advice = verdict.prefill_saved_s, verdict.advice
    return LookupResult(
        keys=len(names), prefix_len=count, prefix_bytes=nbytes,
        tiers={t: TierRun(k, b) for t, (k, b) in tiers.items()},
        load_s=est.load_s, rtt_s=est.rtt_s, bytes_per_s=est.bytes_per_s,
        transport=est.transport, basis=est.basis, tokens_reused=tokens,
        prefill_saved_s=saved, advice=advice)


__all__ = ["MAX_TOKENS_PER_KEY", "LookupResult", "TierRun", "advise", "check_rate",
           "lookup_flow"]  # the adapters' rule
