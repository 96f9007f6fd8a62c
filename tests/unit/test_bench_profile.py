"""`make profile`'s parsing (workload names, py-spy raw output) and its put loops' remove groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellar.bench.profile import (
    PUT_GROUP_KEYS,
    SEGMENT_BYTES,
    Workload,
    put_group_rounds,
    summarize,
)


def test_workload_names_parse_and_bad_ones_are_refused():
    assert Workload.parse("tcp-put-zc-64KiB-x128") == Workload("tcp", "put", "zc", 65536, 128)
    assert Workload.parse("shm-get-bytes-4MiB-x16") == Workload("shm", "get", "bytes", 4 << 20, 16)
    for bad in ("tcp-put-zc-64KB-x128", "tcp-del-zc-64KiB-x1", "tcp-put", "tcp-put-zc-xKiB-x1"):
        with pytest.raises(SystemExit):
            Workload.parse(bad)


def test_summarize_gives_self_and_inclusive_shares(tmp_path: Path):
    raw = tmp_path / "raw.txt"
    raw.write_text("process 1;thread 2;main (a.py:1);work (a.py:5) 3\n"
                   "process 1;thread 2;main (a.py:1);idle (a.py:9) 1\n")
    text = "\n".join(summarize(raw))
    assert "4 active samples" in text
    assert " 75.0%  work (a.py:5)" in text
    assert "100.0%  main (a.py:1)" in text


def test_put_loops_remove_a_group_of_keys_at_a_time_within_a_quarter_of_the_segment():
    assert put_group_rounds(Workload.parse("tcp-put-zc-64KiB-x1")) == PUT_GROUP_KEYS
    assert put_group_rounds(Workload.parse("tcp-put-zc-64KiB-x16")) == PUT_GROUP_KEYS // 16
    assert put_group_rounds(Workload.parse("tcp-put-zc-64KiB-x128")) == PUT_GROUP_KEYS // 128
    for name in ("tcp-put-zc-1MiB-x16", "shm-put-zc-16MiB-x16", "tcp-put-zc-64MiB-x128"):
        w = Workload.parse(name)
        rounds = put_group_rounds(w)
        assert rounds >= 1
        assert rounds == 1 or rounds * w.batch * w.size_bytes <= SEGMENT_BYTES // 4
