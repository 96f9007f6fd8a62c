"""The benches' halt-poll window (bench/halt_poll.py): read, described, set and always restored.

Run against a file standing in for the sysfs parameter, so it never touches the machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellar.bench import halt_poll
from cellar.bench.run import markdown


def _param(tmp_path: Path, value: str) -> Path:
    param = tmp_path / "guest_halt_poll_ns"
    param.write_text(value + "\n")
    return param


def test_the_window_is_read_and_a_missing_driver_says_so(tmp_path: Path):
    assert halt_poll.read_ns(_param(tmp_path, "200000")) == 200_000
    assert halt_poll.read_ns(tmp_path / "absent") is None
    assert halt_poll.read_ns(_param(tmp_path, "garbage")) is None
    assert "200,000 ns" in halt_poll.describe(200_000)
    assert "halts at once" in halt_poll.describe(0)
    assert "none here" in halt_poll.describe(None)


def test_a_window_set_for_a_run_is_put_back_even_when_the_run_fails(tmp_path: Path):
    param = _param(tmp_path, "0")
    with pytest.raises(KeyboardInterrupt), halt_poll.window(200_000, param) as ns:
        assert ns == 200_000
        assert halt_poll.read_ns(param) == 200_000
        raise KeyboardInterrupt
    assert halt_poll.read_ns(param) == 0


def test_no_window_asked_leaves_the_machine_alone(tmp_path: Path):
    param = _param(tmp_path, "50000")
    with halt_poll.window(None, param) as ns:
        assert ns == 50_000
    assert param.read_text() == "50000\n"  # not even rewritten


def test_a_window_out_of_range_or_with_nothing_to_set_is_refused(tmp_path: Path):
    param = _param(tmp_path, "0")
    for bad in (-1, halt_poll.MAX_WINDOW_NS + 1):
        with pytest.raises(ValueError, match="0..10000000 ns"), halt_poll.window(bad, param):
            pass
    with pytest.raises(RuntimeError, match="no halt-poll window"), \
            halt_poll.window(1000, tmp_path / "absent"):
        pass
    assert halt_poll.read_ns(param) == 0


def test_the_bench_report_names_the_window_only_when_it_was_recorded():
    ceilings = {"tcp_issue_GBps": 3.0, "tcp_GBps": 4.0, "tcp_cold_GBps": 2.0,
                "memcpy_aligned_GBps": 9.0}
    report = {"date": "d", "host": "h", "cpus": 2, "ceilings": ceilings, "results": []}
    assert "halt polling" not in markdown(report).splitlines()[0]  # a report from before
    report["guest_halt_poll_ns"] = 0
    assert "`guest_halt_poll_ns`): 0 ns" in markdown(report).splitlines()[0]
