"""The master link's decisions, once: retry, follow a redirect, ask etcd, switch, fence by epoch.

What it owns
    `LinkState`, what a caller knows about the masters (the one it talks to and its generation,
    those it met, the last one it lost, since when the current one fails, when etcd was last
    asked, the highest epoch heard), and the plans that decide from it, written as generators
    of effects like the SDK's flows (`cellar.client.flows`): a plan yields what it needs done
    and receives the answer, and a face performs it with its own I/O. `run_sync` and
    `run_async` are the two ten-line drivers; the sync face (`cellar.client.rpc`), the asyncio
    face (`cellar.client.aio_rpc`) and the storage node (`cellar.storage_node.master_link`, which
    keeps its own mount/heartbeat pacing and asks `node_failure` / `node_target`) all decide
    here. Which master next is
    `cellar.coord.follow.next_master`; what a refusal names is `cellar.coord.redirect.leader_from`.

    Effects: `Attempt` (one gRPC attempt at the current master; answered with `Replied`,
    `Refused` or `Moved`; a non-retryable status the face raises as its typed error),
    `AskEtcd` (the leader's address, or a `CellarError` when etcd is unreachable), `Sleep`,
    `Switch` (point the face at another master: new channel, old one retired, fast line
    dropped; the face calls `LinkState.switched` under its own lock) and `DropFast` (the fast
    line went to the wrong master).

Invariants (bounds)
    - A call makes at most MAX_RPC_ATTEMPTS attempts, never starts one past its deadline, and
      never sleeps past it: backoff doubles from BACKOFF_FIRST_S to BACKOFF_MAX_S.
    - Only one attempt in a row is retried at once after a switch (a redirect loop between two
      masters backs off like any failure).
    - etcd is asked at most once per MIN_LOOKUP_INTERVAL_S per link, each lookup bounded by
      RESOLVE_TIMEOUT_S and the caller's deadline; at most MAX_KNOWN_MASTERS are remembered.
    - A reply whose epoch is older than one already heard is never returned (`EpochFence`).
    - A plan decides about the generation it attempted: a switch by another caller meanwhile
      counts as "moved", never as a second switch.

Must never: perform I/O, sleep, import grpc, the etcd library or any part above coord (the
faces translate their errors into answers); it reads the clock only through `LinkState.clock`,
so tests drive every plan with a fake clock and no sockets.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from cellar.coord.follow import (
    MIN_LOOKUP_INTERVAL_S,
    NO_ETCD,
    EtcdView,
    may_ask_etcd,
    next_master,
    stale_redirect,
)
from cellar.coord.redirect import is_refusal, names_no_leader, valid_address
from cellar.errors import CellarError, Timeout, Unavailable

MAX_RPC_ATTEMPTS = 64
BACKOFF_FIRST_S = 0.02
BACKOFF_MAX_S = 0.5
RESOLVE_TIMEOUT_S = 1.0        # one etcd lookup waits at most this long
RESOLVE_FLOOR_S = 0.05         # ... and at least this long, even at the deadline
MAX_KNOWN_MASTERS = 8
LEADER_CHECK_AFTER_S = 1.0     # with etcd: a call unanswered this long asks etcd who leads
FAST_RELEARN_S = 1.0           # a lost fast line is asked for again at most this often

T = TypeVar("T")


class EpochFence:
    """Refuses replies from a master older than one already heard from (a deposed leader).
    `on_newer` is called when a reply names a newer epoch than one heard before: another
    leader, or a single master restarted (its epoch is its start time)."""

    def __init__(self, on_newer: Callable[[], None] | None = None) -> None:
        self.highest = 0
        self._on_newer = on_newer
        self._lock = threading.Lock()

    def check(self, epoch: int, address: str) -> None:
        assert epoch >= 0, epoch
        with self._lock:
            highest = self.highest
            if epoch >= highest:
                self.highest = epoch
        if epoch < highest:
            raise Unavailable(f"master {address} answered with epoch {epoch}, older than "
                              f"{highest}: it is no longer the leader")
        if 0 < highest < epoch and self._on_newer is not None:
            self._on_newer()


# ---- effects (what a plan asks its face to do) and answers ------------------------------------

@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of `method` at the face's current master, with at most `timeout_s`."""

    method: str
    timeout_s: float


@dataclass(frozen=True, slots=True)
class AskEtcd:
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Switch:
    """Talk to `target` from now on, unless the link left `from_generation` already."""

    target: str
    from_generation: int


@dataclass(frozen=True, slots=True)
class DropFast:
    """Close the fast line in use; ask for one again after `relearn_s`."""

    relearn_s: float


Effect: TypeAlias = Attempt | AskEtcd | Sleep | Switch | DropFast
Plan: TypeAlias = Generator[Effect, Any, T]


@dataclass(frozen=True, slots=True)
class Answer:
    """Who answered an attempt (or failed to): the master and the link generation used."""

    address: str
    generation: int


@dataclass(frozen=True, slots=True)
class Replied(Answer):
    """A reply (a protobuf message with `header.epoch`); `call` is what the face keeps of the
    call (its trailing metadata, to learn the fast line)."""

    reply: Any
    call: Any = None


@dataclass(frozen=True, slots=True)
class Refused(Answer):
    """A retryable refusal: `details` as the master (or gRPC) gave them, `hint` the leader it
    named (`cellar.coord.redirect.leader_from`)."""

    details: str
    hint: str = ""


@dataclass(frozen=True, slots=True)
class Moved(Answer):
    """The attempt was abandoned because the link already follows another master."""

    reason: str


class LinkState:
    """What one caller knows about the masters. Thread-safe where two callers may race (the
    sync face's threads): the lookup claim and the switch; everything else is one word."""

    def __init__(self, seed: str, *, follow: bool = True, etcd: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seed = seed
        self.address = seed
        self.generation = 0          # grows by one with every switch
        self.known = [seed]          # masters met, the seed first
        self.lost: tuple[str, float] = ("", -math.inf)  # the last master found unreachable
        self.failing_since = 0.0     # clock time of the current master's first failure, 0 = none
        self.resolved_at = -math.inf
        self.follow = follow
        self.etcd = etcd             # etcd is the authority on who leads
        self.closed = False
        self.fence = EpochFence(on_newer=self._newer_master)
        self.clock = clock
        self.switches = 0
        self.switched_at = -math.inf  # the last switch, or the last newer epoch heard
        self._lock = threading.Lock()

    def claim_lookup(self, now: float) -> bool:
        """Whether this caller may ask etcd now (and, if so, nobody else may for a while)."""
        with self._lock:
            if not self.etcd or not may_ask_etcd(self.resolved_at, now):
                return False
            self.resolved_at = now
            return True

    def failed(self, generation: int, now: float) -> None:
        if generation == self.generation and not self.failing_since:
            self.failing_since = now

    def succeeded(self, generation: int) -> None:
        if generation == self.generation and self.failing_since:
            self.failing_since = 0.0

    def _newer_master(self) -> None:
        """A reply named a newer epoch (a master restarted, or a new leader): what it voided
        is placed again as after a switch (`cellar.client.flows.near_failover`)."""
        self.switched_at = self.clock()

    def switched(self, target: str) -> str:
        """Record a switch to `target` (the face holds its switch lock); the old address."""
        assert target and target != self.address, (target, self.address)
        old, self.address = self.address, target
        self.generation += 1
        if target not in self.known:
            self.known.append(target)
            del self.known[1:-MAX_KNOWN_MASTERS + 1]  # keep the seed and the newest
        assert len(self.known) <= MAX_KNOWN_MASTERS
        self.failing_since = 0.0
        self.switches += 1
        self.switched_at = self.clock()
        return old


# ---- plans ------------------------------------------------------------------------------------

def ask_etcd(link: LinkState, deadline: float, now: float) -> Plan[EtcdView]:
    """One lookup (the caller claimed it): what etcd says, "" when unreachable or no leader."""
    timeout_s = max(RESOLVE_FLOOR_S, min(RESOLVE_TIMEOUT_S, deadline - now))
    try:
        leader = valid_address((yield AskEtcd(timeout_s)))
    except CellarError:
        leader = ""  # etcd unreachable: a master's redirect is the best guess left
    return EtcdView(configured=True, asked=True, leader=leader)


def redirect(link: LinkState, generation: int, hint: str, deadline: float,
             unreachable: bool = False) -> Plan[bool]:
    """After the master of `generation` did not serve a call: point the link at the leader.
    True when the next attempt goes to another master (this plan switched, or another caller
    did). `unreachable`: the master did not answer at all (not a refusal naming no leader)."""
    if not link.follow or link.closed:
        return False
    now = link.clock()
    link.failed(generation, now)
    if link.generation != generation:
        return True
    failed = link.address
    etcd = NO_ETCD
    if link.etcd:
        etcd = (yield from ask_etcd(link, deadline, now)) if link.claim_lookup(now) \
            else EtcdView(configured=True)
        if link.generation != generation:
            return True  # another caller switched while etcd was asked
    target = next_master(current=failed, hint=hint, etcd=etcd, known=link.known,
                         failing_for_s=now - link.failing_since, lost=link.lost, now=now)
    if unreachable:
        link.lost = (failed, now)
    if not target or link.closed:
        return False
    yield Switch(target, generation)
    return True


def moved_on(link: LinkState, generation: int, deadline: float) -> Plan[bool]:
    """With etcd, while an attempt at the master of `generation` has no answer: whether the
    leader is another master now (and if so, switch to it). Rate-limited like every lookup."""
    if link.generation != generation:
        return True
    now = link.clock()
    if not link.claim_lookup(now):
        return False
    current = link.address
    etcd = yield from ask_etcd(link, deadline, now)
    if link.generation != generation:
        return True
    target = next_master(current=current, hint="", etcd=etcd, known=link.known,
                         failing_for_s=0.0, now=now)
    if not target:
        return False  # etcd still names this master, names none, or is unreachable
    yield Switch(target, generation)
    return True


def call(link: LinkState, method: str, deadline: float) -> Plan[Replied]:
    """One master RPC over gRPC until it is answered, refused for good, or out of time: the
    answer that carries the reply. Raises `Unavailable` with the last failure (or `Timeout`
    when none was seen), or what a face raised for a non-retryable status."""
    backoff_s = BACKOFF_FIRST_S
    failure = ""
    redirected = False  # the previous attempt moved to another master: retry at once
    for _attempt in range(MAX_RPC_ATTEMPTS):
        remaining_s = deadline - link.clock()
        if remaining_s <= 0:
            break
        answer = yield Attempt(method, remaining_s)
        assert isinstance(answer, Answer), answer
        hint = ""
        unreachable = False
        if isinstance(answer, Moved):
            failure = f"{method} to master {answer.address}: {answer.reason}"
            redirected = False
            continue  # the link already points at the new leader
        if isinstance(answer, Refused):
            failure = f"{method} to master {answer.address}: {answer.details or 'unreachable'}"
            hint = answer.hint
            unreachable = not hint and not is_refusal(answer.details)  # no answer at all
        else:
            assert isinstance(answer, Replied)
            reply = answer.reply
            if method == "ClusterStatus" and reply.role == "standby" and link.follow:
                failure = (f"master {answer.address} is a standby "
                           f"(leader {reply.leader_address or 'unknown'})")
                hint = valid_address(reply.leader_address)
            else:
                try:
                    link.fence.check(int(reply.header.epoch), answer.address)
                except Unavailable as exc:
                    if not (link.etcd and link.follow):
                        raise
                    failure = str(exc)  # a deposed leader: ask etcd who leads now
                else:
                    link.succeeded(answer.generation)
                    return answer
        moved = yield from redirect(link, answer.generation, hint, deadline, unreachable)
        if moved and not redirected:
            redirected = True
            continue
        redirected = False
        if deadline - link.clock() <= backoff_s:
            break
        yield Sleep(backoff_s)
        backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
    if not failure:
        raise Timeout(f"{method} to master {link.address}: timed out")
    raise Unavailable(failure)


def fast_reply(link: LinkState, answer: Replied | Refused, deadline: float) -> Plan[Any]:
    """After the fast line answered: the reply, or None when gRPC should carry the call (a
    refusal: a redirect is followed first; a fenced reply with etcd: gRPC retries it at the
    leader etcd names). Without etcd a fenced reply raises, as over gRPC."""
    if isinstance(answer, Refused):
        if answer.hint and link.follow:
            yield DropFast(relearn_s=0.0)
            yield from redirect(link, answer.generation, answer.hint, deadline)
        return None
    try:
        link.fence.check(int(answer.reply.header.epoch), answer.address)
    except Unavailable:
        if not (link.etcd and link.follow):
            raise
        yield DropFast(relearn_s=0.0)
        yield from redirect(link, answer.generation, "", deadline)
        return None
    return answer.reply


# ---- the storage node's decisions (it paces its own retries: mount backoff, heartbeats) -------

@dataclass(frozen=True, slots=True)
class NodeFailure:
    """What a failed mount, report or heartbeat means for the node's next step."""

    redirect: str      # the leader to follow at once ("" none)
    election: bool     # a standby knows no leader, or names the one just lost: one is coming
    unreachable: bool  # the master did not answer: look the leader up (etcd, or the seed)


def node_failure(link: LinkState, *, unavailable: bool, unreachable: bool, details: str,
                 hint: str, now: float) -> NodeFailure:
    """Classify a failed node RPC (`unavailable`: status UNAVAILABLE; `unreachable`: no answer,
    UNAVAILABLE or DEADLINE_EXCEEDED or CANCELLED; `hint`: `redirect.leader_from`), and record
    the failure and the master lost in `link`."""
    hint = hint if unavailable else ""
    election = unavailable and names_no_leader(details)
    link.failed(link.generation, now)
    if stale_redirect(hint, link.lost, now):
        # A standby still names the leader just lost (its lease has not lapsed yet): an
        # election is coming, so wait instead of bouncing between the two.
        hint, election = "", True
    if hint and hint != link.address:
        return NodeFailure(hint, election, False)
    if unreachable and not election:
        link.lost = (link.address, now)
    return NodeFailure("", election, unreachable)


def node_target(link: LinkState, *, hint: str, etcd: EtcdView, configured: str,
                now: float) -> str:
    """The master the node's next RPC goes to ("" = stay): `next_master` with the node's known
    masters (the configured address first, without etcd) and no rotation wait, since the node
    asks only after a failed RPC and spaces its retries by FAILOVER_POLL_S already."""
    known = [] if etcd.configured else [configured]
    if link.address and link.address not in known:
        known.append(link.address)
    failing_for_s = now - link.failing_since if link.failing_since else 0.0
    return next_master(current=link.address, hint=hint, etcd=etcd, known=known,
                       failing_for_s=failing_for_s, lost=link.lost, now=now, rotate_after_s=0.0)


# ---- drivers ----------------------------------------------------------------------------------

def run_sync(plan: Plan[T], perform: Callable[[Effect], Any]) -> T:
    """Carry out `plan` with a blocking `perform`; its exceptions go back into the plan."""
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = plan.throw(error) if error is not None else plan.send(send)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send, error = None, None
        try:
            send = perform(effect)
        except Exception as exc:  # noqa: BLE001 - the plan decides what an error means
            error = exc


async def run_async(plan: Plan[T], perform: Callable[[Effect], Awaitable[Any]]) -> T:
    """`run_sync` for an awaiting `perform` (one event loop)."""
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = plan.throw(error) if error is not None else plan.send(send)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send, error = None, None
        try:
            send = await perform(effect)
        except Exception as exc:  # noqa: BLE001 - the plan decides what an error means
            error = exc


__all__ = [
    "BACKOFF_FIRST_S", "BACKOFF_MAX_S", "FAST_RELEARN_S", "LEADER_CHECK_AFTER_S",
    "MAX_KNOWN_MASTERS", "MAX_RPC_ATTEMPTS", "MIN_LOOKUP_INTERVAL_S", "RESOLVE_TIMEOUT_S",
    "Answer", "AskEtcd", "Attempt", "DropFast", "Effect", "EpochFence", "LinkState", "Moved",
    "NodeFailure", "Plan", "Refused", "Replied", "Sleep", "Switch", "call", "fast_reply",
    "moved_on", "node_failure", "node_target", "redirect", "run_async", "run_sync",
]
