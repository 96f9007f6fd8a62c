"""Which master to follow next: one pure decision for the SDK (both faces) and the storage node.

Before this module the client's channel and the node's control loop each decided on their own
and disagreed (the node followed a redirect before asking etcd, the client asked etcd first;
only the node refused a redirect back to the master it had just lost). Now both ask
`next_master`, given what they know after a failed call:

    1. A redirect to the master lost less than STALE_REDIRECT_S ago is dropped: a standby whose
       view has not caught up names it, which means an election is coming, not a leader.
    2. With etcd configured, etcd is the authority: the leader it names wins over any redirect.
       When it cannot say (unreachable, or no leader during an election) the redirect is the
       best guess left. When it was not asked (lookups are rate-limited, MIN_LOOKUP_INTERVAL_S)
       the caller stays and retries: no guessing while the authority is a lookup away.
    3. Without etcd: a redirect is followed; a master that has failed for ROTATE_AFTER_S
       without naming anyone is left for the next master the caller knew (the configured
       seed first, then the others in the order they were met), so a caller sent to a leader
       that died finds its way back through the address it was configured with.

An empty answer means "stay with the current master and retry". No I/O, no clock: the caller
passes `now` and what etcd said.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

STALE_REDIRECT_S = 5.0      # a redirect to the master lost this recently is not followed
ROTATE_AFTER_S = 1.0        # without etcd or a redirect: try another known master after this
MIN_LOOKUP_INTERVAL_S = 0.1  # at most one etcd lookup per this long per caller


@dataclass(frozen=True, slots=True)
class EtcdView:
    """What etcd contributed to one decision."""

    configured: bool = False
    asked: bool = False      # a lookup was made for this decision
    leader: str = ""         # the address it names ("" = unreachable, or no leader elected)


NO_ETCD = EtcdView()


def may_ask_etcd(last_asked_at: float, now: float) -> bool:
    """Whether a caller may look the leader up again (rate limit)."""
    return now - last_asked_at >= MIN_LOOKUP_INTERVAL_S


def stale_redirect(hint: str, lost: tuple[str, float], now: float) -> bool:
    """Whether `hint` names the master lost less than STALE_REDIRECT_S ago (rule 1): a sign
    that an election is coming, not a leader to follow."""
    return bool(hint) and hint == lost[0] and now - lost[1] < STALE_REDIRECT_S


def next_master(*, current: str, hint: str, etcd: EtcdView, known: Sequence[str],
                failing_for_s: float, lost: tuple[str, float] = ("", -math.inf),
                now: float = 0.0, rotate_after_s: float | None = None) -> str:
    """The master the next attempt goes to, or "" to stay with `current`.

    `hint`: the leader a refusal named ("" for none); `known`: masters met, the configured
    seed first; `failing_for_s`: how long `current` has failed without a success; `lost`:
    (address, when) of the last master found unreachable; `rotate_after_s`: rule 3's wait
    (ROTATE_AFTER_S unless the caller spaces its own retries, as the storage node does).
    """
    rotate_s = ROTATE_AFTER_S if rotate_after_s is None else rotate_after_s
    if stale_redirect(hint, lost, now):
        hint = ""
    if etcd.configured:
        if not etcd.asked:
            return ""
        target = etcd.leader or hint
    elif hint:
        target = hint
    elif failing_for_s >= rotate_s and len(known) > 1:
        i = known.index(current) if current in known else -1
        target = known[(i + 1) % len(known)]
    else:
        target = ""
    return "" if target == current else target
