"""Segments (file, mapping, stable ids, exclusivity) and NodeConfig (flags, validation)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cellar.config import load
from cellar.errors import ConfigError
from cellar.storage_node.config import ENV_PREFIX, NodeConfig
from cellar.storage_node.main import build_parser
from cellar.storage_node.segment import Segment, SegmentError, segment_id_for, segment_path

SIZE = 1 << 20


def test_segment_file_mapping_and_cleanup(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, "n1", 0, SIZE)
    try:
        assert seg.path == segment_path(tmp_path, "n1", 0)
        assert seg.path is not None and seg.path.stat().st_size == SIZE
        assert seg.segment_id == segment_id_for("n1", 0)
        seg.view(100, 5)[:] = b"hello"
        with open(seg.path, "rb") as f:  # shared mapping: the file sees the bytes
            f.seek(100)
            assert f.read(5) == b"hello"
        with pytest.raises(IndexError):
            seg.view(SIZE - 1, 2)
        with pytest.raises(IndexError):
            seg.view(-1, 1)
        assert seg.contains(0, SIZE) and not seg.contains(1, SIZE)
    finally:
        seg.close(unlink=True)
    assert not (tmp_path / "cellar-n1-0.seg").exists()
    seg.close(unlink=True)  # twice is fine


def test_segment_kept_and_reopened_with_contents(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, "n1", 0, SIZE)
    seg.view(0, 3)[:] = b"abc"
    seg.close(unlink=False)
    again = Segment.create(tmp_path, "n1", 0, SIZE)
    try:
        assert bytes(again.view(0, 3)) == b"abc"
        assert again.segment_id == seg.segment_id
    finally:
        again.close(unlink=True)


def test_segment_ids_are_stable_and_distinct() -> None:
    assert segment_id_for("a", 0) == segment_id_for("a", 0)
    ids = {segment_id_for(n, i) for n in ("a", "b") for i in range(4)}
    assert len(ids) == 8 and all(0 < i < (1 << 63) for i in ids)


def test_two_processes_cannot_share_a_segment(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, "dup", 0, SIZE)
    try:
        code = ("import sys\n"
                "from cellar.storage_node.segment import Segment, SegmentError\n"
                "try:\n"
                f"    Segment.create({str(tmp_path)!r}, 'dup', 0, {SIZE})\n"
                "except SegmentError as e:\n"
                "    print(e); sys.exit(0)\n"
                "sys.exit(1)\n")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0, result.stderr
        assert "held by another running node" in result.stdout
    finally:
        seg.close(unlink=True)


def test_hugepages_needs_hugetlbfs(tmp_path: Path) -> None:
    with pytest.raises(SegmentError, match="hugetlbfs"):
        Segment.create(tmp_path, "h", 0, SIZE, hugepages=True)
    assert not (tmp_path / "cellar-h-0.seg").exists()


def test_config_segment_size_alias_and_defaults(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["--segment-size", "64MiB", "--master", "10.0.0.1:1", "--shm-dir", str(tmp_path)])
    cfg, sources = load(NodeConfig, env_prefix=ENV_PREFIX, args=args, environ={})
    assert cfg.segment_size_bytes == 64 << 20 and cfg.master == "10.0.0.1:1"
    assert cfg.node_id and cfg.host_id
    assert NodeConfig().host_id == cfg.host_id          # same machine, same host id
    assert NodeConfig().node_id != NodeConfig().node_id  # random suffix
    args = build_parser().parse_args(["--segment-size-bytes", "2MiB"])
    cfg, _ = load(NodeConfig, env_prefix=ENV_PREFIX, args=args, environ={})
    assert cfg.segment_size_bytes == 2 << 20
    cfg, _ = load(NodeConfig, env_prefix=ENV_PREFIX, environ={"CELLAR_NODE_SEGMENTS": "3"})
    assert cfg.segments == 3 and cfg.data_spin_us == 300
    cfg, _ = load(NodeConfig, env_prefix=ENV_PREFIX, environ={"CELLAR_NODE_DATA_SPIN_US": "0"})
    assert cfg.data_spin_us == 0


@pytest.mark.parametrize("field,value", [
    ("segment_size_bytes", "1000"),
    ("segment_size_bytes", "1048577"),
    ("segments", "0"),
    ("node_id", "a/b"),
    ("master", "nohostport"),
    ("listen", "x:99999"),
    ("http", "bad"),
    ("heartbeat_interval_s", "0"),
    ("shm_dir", "/does/not/exist"),
    ("data_spin_us", "-1"),
    ("data_spin_us", "10001"),
])
def test_config_validation_names_the_field(field: str, value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(NodeConfig, env_prefix=ENV_PREFIX, environ={}, overrides={field: value})
    assert exc.value.field == field


def test_mlock_small_segment(tmp_path: Path) -> None:
    try:
        seg = Segment.create(tmp_path, "m", 0, SIZE, mlock=True)
    except SegmentError as exc:  # an unprivileged run with a tiny memlock limit
        assert "memlock" in str(exc)
        return
    try:
        seg.view(0, 4)[:] = b"lock"
        assert bytes(seg.view(0, 4)) == b"lock"
    finally:
        seg.close(unlink=True)
