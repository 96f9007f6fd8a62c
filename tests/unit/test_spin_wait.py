"""The reply wait that spins before it blocks (transfer/spin_wait.py) and its setting.

Real sockets (a socketpair); what is asserted is the outcome of each wait and the bounds on
spinning (rest after misses, one spinner per process), never a duration.
"""

from __future__ import annotations

import socket
import threading

import pytest

from cellar.client.checks import spin_us_from_env
from cellar.errors import InvalidArgument
from cellar.transfer import spin_wait
from cellar.transfer.spin_wait import (
    DEFAULT_SPIN_US,
    MAX_SPIN_US,
    MISSES_BEFORE_REST,
    NATIVE,
    REST_CALLS,
    SpinWait,
    never_spin_in_this_thread,
)


@pytest.fixture
def pair():  # type: ignore[no-untyped-def]
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_a_reply_already_there_ends_the_wait_and_stays_unread(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    spin = SpinWait(MAX_SPIN_US)
    b.sendall(b"reply")
    assert spin.wait(a) is True
    assert (spin.spins, spin.hits) == (1, 1)
    assert a.recv(16) == b"reply"  # the wait never consumes a byte


def test_a_reply_sent_during_the_window_is_seen(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    spin = SpinWait(MAX_SPIN_US)  # 10 ms: the sender below starts well within it
    sender = threading.Thread(target=b.sendall, args=(b"late",))
    sender.start()
    try:
        seen = spin.wait(a)
    finally:
        sender.join()
    # a loaded machine may start the sender after the window: then the wait says so
    assert seen is (spin.hits == 1)
    assert a.recv(16) == b"late"


def test_windows_that_keep_expiring_rest_then_try_again(pair) -> None:  # type: ignore[no-untyped-def]
    a, _ = pair
    spin = SpinWait(50)
    for _ in range(MISSES_BEFORE_REST):
        assert spin.wait(a) is False
    assert spin.spins == MISSES_BEFORE_REST and spin.hits == 0
    for _ in range(REST_CALLS):  # resting: block at once, no spinning
        assert spin.wait(a) is False
    assert spin.spins == MISSES_BEFORE_REST
    spin.wait(a)  # the rest is over: one window again
    assert spin.spins == MISSES_BEFORE_REST + 1


def test_a_hit_resets_the_miss_count(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    spin = SpinWait(50)
    for _ in range(MISSES_BEFORE_REST - 1):
        spin.wait(a)
    b.sendall(b"x")
    assert spin.wait(a) is True
    a.recv(1)
    for _ in range(MISSES_BEFORE_REST - 1):
        spin.wait(a)
    assert spin.spins == 2 * (MISSES_BEFORE_REST - 1) + 1  # never rested


def test_only_one_thread_of_the_process_spins(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    other = SpinWait(MAX_SPIN_US)
    mine = SpinWait(MAX_SPIN_US)
    assert spin_wait._SPINNER.acquire()  # another thread (any client) is spinning
    try:
        b.sendall(b"x")
        assert mine.wait(a) is False and mine.spins == 0
    finally:
        spin_wait._SPINNER.release()
    assert mine.wait(a) is True and mine.spins == 1
    assert other.spins == 0


def test_a_zero_window_never_spins(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    spin = SpinWait(0)
    b.sendall(b"x")
    assert spin.wait(a) is False and spin.spins == 0


@pytest.mark.parametrize("bad", [-1, MAX_SPIN_US + 1])
def test_a_window_out_of_range_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="spin_us"):
        SpinWait(bad)


def test_the_window_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELLAR_SPIN_US", raising=False)
    assert spin_us_from_env() == DEFAULT_SPIN_US
    monkeypatch.setenv("CELLAR_SPIN_US", "0")
    assert spin_us_from_env() == 0
    monkeypatch.setenv("CELLAR_SPIN_US", str(MAX_SPIN_US))
    assert spin_us_from_env() == MAX_SPIN_US
    for bad in ("-5", str(MAX_SPIN_US + 1), "fast", "1.5"):
        monkeypatch.setenv("CELLAR_SPIN_US", bad)
        with pytest.raises(InvalidArgument, match="CELLAR_SPIN_US"):
            spin_us_from_env()


def test_the_native_helper_is_built_and_checks_its_arguments(pair) -> None:  # type: ignore[no-untyped-def]
    """Without `_spin` the SDK never spins (make test builds it: a lost build must fail here)."""
    assert NATIVE
    from cellar.transfer._spin import spin

    a, _ = pair
    for fd, window_ns in ((-1, 1000), (a.fileno(), -1), (a.fileno(), MAX_SPIN_US * 1000 + 1)):
        with pytest.raises(ValueError, match="spin"):
            spin(fd, window_ns)
    assert spin(a.fileno(), 0) is False



def test_a_background_thread_never_spins(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    spin = SpinWait(MAX_SPIN_US)
    b.sendall(b"x")
    seen: list[bool] = []

    def background() -> None:
        never_spin_in_this_thread()
        seen.append(spin.wait(a))

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen == [False] and spin.spins == 0
    assert spin.wait(a) is True  # other threads still do
