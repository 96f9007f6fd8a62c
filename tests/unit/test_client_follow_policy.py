"""The one leader-following policy (cellar.coord.follow), as a table: no I/O, no clock."""

from __future__ import annotations

import pytest

from cellar.coord import follow
from cellar.coord.follow import NO_ETCD, EtcdView, may_ask_etcd, next_master, stale_redirect

ETCD_SAYS_B = EtcdView(configured=True, asked=True, leader="b:1")
ETCD_SILENT = EtcdView(configured=True, asked=True, leader="")   # unreachable or election
ETCD_NOT_ASKED = EtcdView(configured=True)
KNOWN = ["seed:1", "a:1", "c:1"]


@pytest.mark.parametrize("current, hint, etcd, failing_for_s, lost, want", [
    # etcd is the authority over a redirect
    ("a:1", "stale:1", ETCD_SAYS_B, 0.0, ("", -1e9), "b:1"),
    ("b:1", "stale:1", ETCD_SAYS_B, 0.0, ("", -1e9), ""),           # already there: stay
    # etcd cannot say: the redirect is the best guess; with none, stay
    ("a:1", "c:1", ETCD_SILENT, 0.0, ("", -1e9), "c:1"),
    ("a:1", "", ETCD_SILENT, 5.0, ("", -1e9), ""),                   # never rotate with etcd
    # rate-limited: stay and retry, even with a redirect in hand
    ("a:1", "c:1", ETCD_NOT_ASKED, 0.0, ("", -1e9), ""),
    # without etcd: redirect at once; rotate through the known masters after ROTATE_AFTER_S
    ("a:1", "c:1", NO_ETCD, 0.0, ("", -1e9), "c:1"),
    ("a:1", "", NO_ETCD, 0.5, ("", -1e9), ""),
    ("a:1", "", NO_ETCD, 1.0, ("", -1e9), "c:1"),
    ("c:1", "", NO_ETCD, 1.0, ("", -1e9), "seed:1"),                 # wraps to the seed
    ("x:1", "", NO_ETCD, 1.0, ("", -1e9), "seed:1"),                 # unknown current: seed
    # a redirect back to the master just lost means an election: dropped for STALE_REDIRECT_S
    ("seed:1", "a:1", NO_ETCD, 0.0, ("a:1", 98.0), ""),
    ("seed:1", "a:1", NO_ETCD, 0.0, ("a:1", 90.0), "a:1"),            # lost long ago: follow
    ("seed:1", "a:1", ETCD_SILENT, 0.0, ("a:1", 98.0), ""),
    ("seed:1", "a:1", ETCD_SAYS_B, 0.0, ("a:1", 98.0), "b:1"),
])
def test_next_master(current, hint, etcd, failing_for_s, lost, want):
    assert next_master(current=current, hint=hint, etcd=etcd, known=KNOWN,
                       failing_for_s=failing_for_s, lost=lost, now=100.0) == want


def test_a_single_known_master_is_never_rotated_away_from():
    assert next_master(current="seed:1", hint="", etcd=NO_ETCD, known=["seed:1"],
                       failing_for_s=60.0) == ""


def test_rotation_wait_is_the_callers_when_it_spaces_its_own_retries():
    assert next_master(current="a:1", hint="", etcd=NO_ETCD, known=KNOWN, failing_for_s=0.0,
                       rotate_after_s=0.0) == "c:1"


def test_lookup_rate_limit_and_stale_redirects():
    assert may_ask_etcd(-1e9, 0.0)
    assert not may_ask_etcd(10.0, 10.0 + follow.MIN_LOOKUP_INTERVAL_S / 2)
    assert may_ask_etcd(10.0, 10.0 + 2 * follow.MIN_LOOKUP_INTERVAL_S)
    assert stale_redirect("a:1", ("a:1", 0.0), follow.STALE_REDIRECT_S - 0.1)
    assert not stale_redirect("a:1", ("a:1", 0.0), follow.STALE_REDIRECT_S)
    assert not stale_redirect("", ("", 0.0), 0.0)
