"""The master link's decisions (cellar.coord.link) driven without sockets or sleeps: each plan
is stepped by hand, a fake clock advances only when a plan sleeps, and every effect it asks for
is checked in order, as are its bounds (attempts, backoff, lookups, the deadline)."""

from __future__ import annotations

from typing import Any

import pytest

import cellar
from cellar.coord import link as plans
from cellar.coord.follow import MIN_LOOKUP_INTERVAL_S
from cellar.coord.link import (
    AskEtcd,
    Attempt,
    DropFast,
    LinkState,
    Moved,
    Refused,
    Replied,
    Sleep,
    Switch,
)
from cellar.coord.redirect import redirect_details
from cellar.proto import cellar_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_link(seed: str = "a:1", **kw: Any) -> tuple[LinkState, Clock]:
    clock = Clock()
    return LinkState(seed, clock=clock, **kw), clock


def reply(epoch: int = 10, role: str = "", leader: str = "") -> pb.ClusterStatusReply:
    return pb.ClusterStatusReply(header=pb.ReplyHeader(epoch=epoch), role=role,
                                 leader_address=leader)


class Driver:
    """Steps a plan: `expect(kind)` returns the next effect (checking its type); `answer`
    sends the result of the last one. A Sleep advances the fake clock; a Switch is performed
    as a face would."""

    def __init__(self, plan: Any, link: LinkState, clock: Clock) -> None:
        self.plan, self.link, self.clock = plan, link, clock
        self.effects: list[Any] = []
        self.result: Any = None
        self.done = False
        self._pending: Any = None
        self._advance()

    def _advance(self, value: Any = None, error: BaseException | None = None) -> None:
        try:
            self._pending = self.plan.throw(error) if error else self.plan.send(value)
        except StopIteration as stop:
            self.done, self.result, self._pending = True, stop.value, None

    def expect(self, kind: type) -> Any:
        effect = self._pending
        assert isinstance(effect, kind), (effect, kind)
        self.effects.append(effect)
        return effect

    def answer(self, value: Any = None, error: BaseException | None = None) -> None:
        self._advance(value, error)

    def run_quiet(self) -> None:
        """Perform every Sleep / Switch / DropFast until the next Attempt or AskEtcd (or the end)."""
        while not self.done:
            effect = self._pending
            if isinstance(effect, Sleep):
                self.effects.append(effect)
                self.clock.now += effect.seconds
                self._advance()
            elif isinstance(effect, Switch):
                self.effects.append(effect)
                if self.link.generation == effect.from_generation:
                    self.link.switched(effect.target)
                self._advance()
            elif isinstance(effect, DropFast):
                self.effects.append(effect)
                self._advance()
            else:
                return

    def refuse(self, details: str, hint: str = "") -> None:
        self.expect(Attempt)
        self.answer(Refused(self.link.address, self.link.generation, details, hint))
        self.run_quiet()


def test_a_reply_ends_the_call_and_clears_the_failure_clock():
    link, clock = make_link()
    link.failing_since = 99.0
    d = Driver(plans.call(link, "Remove", clock.now + 2), link, clock)
    attempt = d.expect(Attempt)
    assert attempt.method == "Remove" and attempt.timeout_s == pytest.approx(2.0)
    d.answer(Replied("a:1", 0, reply(epoch=7)))
    assert d.done and d.result.reply.header.epoch == 7
    assert link.failing_since == 0.0 and link.fence.highest == 7


def test_a_redirect_switches_and_retries_at_once():
    link, clock = make_link()
    d = Driver(plans.call(link, "Remove", clock.now + 2), link, clock)
    d.refuse(redirect_details("m", "standby", "l:1", 3), hint="l:1")
    assert [type(e) for e in d.effects] == [Attempt, Switch]
    assert d.effects[1] == Switch("l:1", 0) and link.address == "l:1" and link.generation == 1
    d.expect(Attempt)                                 # no Sleep before the retry
    d.answer(Replied("l:1", 1, reply()))
    assert d.done and link.switches == 1 and link.known == ["a:1", "l:1"]


def test_a_redirect_loop_backs_off_after_one_immediate_retry():
    link, clock = make_link()
    d = Driver(plans.call(link, "Remove", clock.now + 5), link, clock)
    d.refuse("leader=b:1", hint="b:1")
    d.refuse("leader=a:1", hint="a:1")
    kinds = [type(e) for e in d.effects]
    assert kinds == [Attempt, Switch, Attempt, Switch, Sleep]  # the second switch waits
    assert d.effects[-1].seconds == plans.BACKOFF_FIRST_S


def test_a_master_naming_no_leader_is_retried_with_bounded_backoff_until_the_deadline():
    link, clock = make_link()
    deadline = clock.now + 3.0
    d = Driver(plans.call(link, "Remove", deadline), link, clock)
    with pytest.raises(cellar.Unavailable, match="leader=\\?"):
        while True:
            d.refuse(redirect_details("m", "standby", "", 0))
    sleeps = [e.seconds for e in d.effects if isinstance(e, Sleep)]
    assert sleeps[:3] == [0.02, 0.04, 0.08] and max(sleeps) == plans.BACKOFF_MAX_S
    assert all(b >= a for a, b in zip(sleeps, sleeps[1:], strict=False))
    assert clock.now <= deadline                       # never slept past it
    assert not [e for e in d.effects if isinstance(e, Switch)] and link.address == "a:1"
    attempts = [e for e in d.effects if isinstance(e, Attempt)]
    assert all(a.timeout_s > 0 for a in attempts)


def test_attempts_are_bounded_even_when_no_time_passes():
    link, clock = make_link()
    d = Driver(plans.call(link, "Remove", clock.now + 60), link, clock)
    with pytest.raises(cellar.Unavailable, match="moved"):
        while True:
            d.expect(Attempt)
            d.answer(Moved(link.address, link.generation, "moved"))
    assert len(d.effects) == plans.MAX_RPC_ATTEMPTS


def test_a_call_past_its_deadline_is_a_timeout_without_an_attempt():
    link, clock = make_link()
    plan = plans.call(link, "Remove", clock.now - 0.1)
    with pytest.raises(cellar.Timeout):
        next(plan)


def test_etcd_is_asked_and_beats_the_redirect_then_lookups_are_rate_limited():
    link, clock = make_link(etcd=True)
    d = Driver(plans.call(link, "Remove", clock.now + 5), link, clock)
    d.refuse("leader=stale:1", hint="stale:1")
    ask = d.expect(AskEtcd)
    assert 0 < ask.timeout_s <= plans.RESOLVE_TIMEOUT_S
    d.answer("e:1")
    d.run_quiet()
    assert link.address == "e:1"
    # e:1 does not answer: within MIN_LOOKUP_INTERVAL_S of that lookup etcd is not asked
    # again (the call backs off), after it etcd is asked again.
    d.refuse("failed to connect")
    assert [type(e) for e in d.effects] == [Attempt, AskEtcd, Switch, Attempt, Sleep]
    while not isinstance(d._pending, AskEtcd):
        d.refuse("failed to connect")
    d.expect(AskEtcd)
    asks_at = [link.resolved_at]
    d.answer("")                                       # election: etcd names none
    d.run_quiet()
    assert asks_at[0] - 100.0 >= MIN_LOOKUP_INTERVAL_S and link.address == "e:1"
    assert len([e for e in d.effects if isinstance(e, AskEtcd)]) == 2


def test_an_unreachable_etcd_leaves_the_redirect_as_the_best_guess():
    link, clock = make_link(etcd=True)
    d = Driver(plans.call(link, "Remove", clock.now + 5), link, clock)
    d.refuse("leader=l:1", hint="l:1")
    d.expect(AskEtcd)
    d.answer(error=cellar.Unavailable("etcd down"))
    d.run_quiet()
    assert link.address == "l:1"


def test_the_fence_raises_without_etcd_and_asks_etcd_with_it():
    link, clock = make_link()
    link.fence.check(50, "elsewhere")
    d = Driver(plans.call(link, "Remove", clock.now + 5), link, clock)
    d.expect(Attempt)
    with pytest.raises(cellar.Unavailable, match="older than 50"):
        d.answer(Replied("a:1", 0, reply(epoch=40)))
    link, clock = make_link(etcd=True)
    link.fence.check(50, "elsewhere")
    d = Driver(plans.call(link, "Remove", clock.now + 5), link, clock)
    d.expect(Attempt)
    d.answer(Replied("a:1", 0, reply(epoch=40)))
    d.expect(AskEtcd)
    d.answer("new:1")
    d.run_quiet()
    d.expect(Attempt)
    d.answer(Replied("new:1", 1, reply(epoch=60)))
    assert d.done and link.fence.highest == 60


def test_a_standby_cluster_status_is_a_redirect_unless_the_link_does_not_follow():
    link, clock = make_link()
    d = Driver(plans.call(link, "ClusterStatus", clock.now + 5), link, clock)
    d.expect(Attempt)
    d.answer(Replied("a:1", 0, reply(role="standby", leader="l:1")))
    d.run_quiet()
    assert link.address == "l:1"
    probe, clock = make_link(follow=False)
    d = Driver(plans.call(probe, "ClusterStatus", clock.now + 5), probe, clock)
    d.expect(Attempt)
    d.answer(Replied("a:1", 0, reply(role="standby", leader="l:1")))
    assert d.done and d.result.reply.role == "standby" and probe.address == "a:1"


def test_without_etcd_a_silent_master_rotates_back_to_the_seed():
    link, clock = make_link("s:1")
    link.switched("l:1")
    d = Driver(plans.call(link, "Remove", clock.now + 10), link, clock)
    while link.address == "l:1":
        d.refuse("failed to connect")
    assert link.address == "s:1" and link.lost[0] == "l:1"
    assert clock.now - 100.0 >= 1.0                     # only after ROTATE_AFTER_S of failures


def test_a_redirect_to_the_master_just_lost_is_not_followed():
    link, clock = make_link("s:1")
    link.switched("l:1")
    link.lost = ("l:1", clock.now)
    link.switched("s:1")
    d = Driver(plans.redirect(link, link.generation, "l:1", clock.now + 5), link, clock)
    assert d.done and d.result is False and link.address == "s:1"


def test_a_switch_by_another_caller_during_the_lookup_counts_as_moved():
    link, clock = make_link(etcd=True)
    d = Driver(plans.redirect(link, 0, "", clock.now + 5), link, clock)
    d.expect(AskEtcd)
    link.switched("other:1")                            # another thread followed meanwhile
    d.answer("third:1")
    assert d.done and d.result is True and link.address == "other:1"
    assert not [e for e in d.effects if isinstance(e, Switch)]


def test_moved_on_asks_etcd_at_most_once_per_interval():
    link, clock = make_link(etcd=True)
    d = Driver(plans.moved_on(link, 0, clock.now + 5), link, clock)
    d.expect(AskEtcd)
    d.answer("a:1")                                     # still the leader
    assert d.done and d.result is False
    d = Driver(plans.moved_on(link, 0, clock.now + 5), link, clock)
    assert d.done and d.result is False                 # rate-limited: not asked
    clock.now += MIN_LOOKUP_INTERVAL_S + 1e-9
    d = Driver(plans.moved_on(link, 0, clock.now + 5), link, clock)
    d.expect(AskEtcd)
    d.answer("b:1")
    d.run_quiet()
    assert d.result is True and link.address == "b:1"
    assert Driver(plans.moved_on(link, 0, clock.now + 5), link, clock).result is True


def test_a_fast_line_redirect_drops_the_line_then_switches():
    link, clock = make_link()
    d = Driver(plans.fast_reply(link, Refused("a:1", 0, "", "l:1"), clock.now + 5), link, clock)
    d.run_quiet()
    assert d.done and d.result is None
    assert d.effects == [DropFast(0.0), Switch("l:1", 0)]
    fenced, clock = make_link()
    fenced.fence.check(20, "x")
    plan = plans.fast_reply(fenced, Replied("a:1", 0, reply(epoch=10)), clock.now + 5)
    with pytest.raises(cellar.Unavailable, match="older than 20"):
        next(plan)


def test_known_masters_are_bounded_and_keep_the_seed_first():
    link, _ = make_link("seed:1")
    for i in range(3 * plans.MAX_KNOWN_MASTERS):
        link.switched(f"m{i}:1")
    assert len(link.known) == plans.MAX_KNOWN_MASTERS and link.known[0] == "seed:1"
    assert link.known[-1] == f"m{3 * plans.MAX_KNOWN_MASTERS - 1}:1"


def test_run_sync_hands_errors_back_to_the_plan():
    link, clock = make_link("a:1", etcd=True)

    def perform(effect: Any) -> Any:
        if isinstance(effect, AskEtcd):
            raise cellar.Unavailable("etcd down")
        if isinstance(effect, Switch):
            link.switched(effect.target)
        return None

    assert plans.run_sync(plans.redirect(link, 0, "l:1", clock.now + 5), perform) is True
    assert link.address == "l:1"


# ---- the storage node's decisions -------------------------------------------------------------

def test_node_failure_follows_a_redirect_and_records_an_unreachable_master():
    link, _ = make_link("m:1")
    to = plans.node_failure(link, unavailable=True, unreachable=True, details="leader=l:1",
                            hint="l:1", now=5.0)
    assert to.redirect == "l:1" and not to.election and link.lost[0] == ""
    assert link.failing_since == 5.0
    gone = plans.node_failure(link, unavailable=True, unreachable=True, details="refused",
                              hint="", now=6.0)
    assert gone.unreachable and gone.redirect == "" and link.lost == ("m:1", 6.0)
    assert link.failing_since == 5.0                     # the first failure is kept


def test_node_failure_reads_an_election_and_a_stale_redirect():
    link, _ = make_link("m:1")
    no_leader = plans.node_failure(link, unavailable=True, unreachable=True,
                                   details=redirect_details("s", "standby", "", 0), hint="",
                                   now=5.0)
    assert no_leader.election and link.lost[0] == ""   # an election is no lost master
    link.lost = ("old:1", 5.0)
    stale = plans.node_failure(link, unavailable=True, unreachable=True, details="leader=old:1",
                               hint="old:1", now=6.0)
    assert stale.election and stale.redirect == ""      # the master just lost is not followed


def test_node_target_goes_back_to_the_configured_master_without_etcd():
    link, _ = make_link("seed:1")
    link.switched("l:1")
    link.failed(link.generation, 10.0)
    assert plans.node_target(link, hint="", etcd=plans.NO_ETCD, configured="seed:1",
                             now=10.0) == "seed:1"
    assert plans.node_target(link, hint="x:1", etcd=plans.NO_ETCD, configured="seed:1",
                             now=10.0) == "x:1"
    with_etcd = plans.EtcdView(configured=True, asked=True, leader="e:1")
    assert plans.node_target(link, hint="x:1", etcd=with_etcd, configured="etcd://h:1/c",
                             now=10.0) == "e:1"
