"""Pure logic of cellar.compat.mooncake: setup arguments, the code table, ReplicateConfig,
registered memory bounds, the regex patterns remove_by_regex serves in one master call and
the paging of the others. No cluster."""

from __future__ import annotations

import ctypes
import re
from typing import Any

import pytest

from cellar.client.pointers import PointerRegistry
from cellar.compat.mooncake import io
from cellar.compat.mooncake.codes import TABLE_ROWS, ErrorCode, code_for, put_code
from cellar.compat.mooncake.config import (
    DEFAULT_SOFT_PIN_TTL_MS,
    MAX_SOFT_PIN_TTL_MS,
    OptionError,
    ReplicateConfig,
    SoftPinAction,
    WriteOptions,
    write_options,
)
from cellar.compat.mooncake.memory import INVALID, BufferHandle, lease_parts
from cellar.compat.mooncake.setup_args import SetupError, build, from_dict, parse_size_bytes
from cellar.compat.mooncake.store import _listen_host, _literal_pattern
from cellar.compat.mooncake.writes import split_segment
from cellar.errors import (
    AlreadyExists,
    BufferTooSmall,
    CellarError,
    IntegrityError,
    InvalidArgument,
    NoSpace,
    NotFound,
    Status,
    Timeout,
    Unavailable,
)

MIB = 1 << 20


@pytest.mark.parametrize("text,nbytes", [
    ("16MB", 16 * MIB), ("16 MB", 16 * MIB), ("16mb", 16 * MIB), ("16M", 16 * MIB),
    ("1.5 GB", 3 << 29), ("4096", 4096), (" 2 KB ", 2048), ("1TB", 1 << 40), ("7B", 7),
    (123, 123), (0, 0),
])
def test_sizes_read_as_mooncake_reads_them(text, nbytes):
    assert parse_size_bytes(text, "size") == nbytes


@pytest.mark.parametrize("text", ["50%", "", "MB", "-1", "16 XB", "1e400GB", "nan", True, -5])
def test_bad_sizes_are_invalid_params(text):
    with pytest.raises(SetupError) as info:
        parse_size_bytes(text, "size")
    assert info.value.code == ErrorCode.INVALID_PARAMS


def test_setup_positional_arguments():
    cfg = build("node1:12345", "http://meta:8080/metadata", "32MB", "1 MB", "rdma", "mlx5_0",
                "etcd://127.0.0.1:2379/c", tenant_id="t1")
    assert (cfg.local_hostname, cfg.master_address, cfg.global_segment_bytes,
            cfg.local_buffer_bytes, cfg.transport, cfg.tenant) == (
        "node1:12345", "etcd://127.0.0.1:2379/c", 32 * MIB, MIB, "rdma", "t1")


def test_setup_refusals_carry_mooncake_codes():
    def code(**overrides):
        args = {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE",
                "global_segment_size": 0, "local_buffer_size": 0, "protocol": "tcp",
                "rdma_devices": "", "master_server_addr": "127.0.0.1:1"}
        args.update(overrides)
        with pytest.raises(SetupError) as info:
            build(**args)
        return info.value.code

    assert code(global_segment_size="50%") == ErrorCode.INVALID_PARAMS
    assert code(local_buffer_size="ten") == ErrorCode.INVALID_PARAMS
    assert code(protocol="efa") == ErrorCode.NOT_SUPPORTED
    assert code(protocol="nvlink") == ErrorCode.NOT_SUPPORTED
    assert code(local_hostname="") == ErrorCode.INVALID_PARAMS
    assert code(master_server_addr=" ") == ErrorCode.INVALID_PARAMS
    assert code(metadata_server=5) == ErrorCode.INVALID_PARAMS
    assert code(enable_ssd_offload=True, ssd_offload_path="/x") == ErrorCode.INVALID_PARAMS  # no segment
    assert code(enable_ssd_offload=True, global_segment_size="8MB") == ErrorCode.INVALID_PARAMS  # no path
    assert code(enable_client_http_server="true") == ErrorCode.NOT_SUPPORTED


def test_enable_ssd_offload_gives_the_embedded_node_a_disk_tier(monkeypatch):
    args = ("h", "P2PHANDSHAKE", "8MB", "1MB", "tcp", "", "127.0.0.1:1")
    monkeypatch.delenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", raising=False)
    cfg = build(*args, enable_ssd_offload=True, ssd_offload_path="/ssd/a")
    assert (cfg.disk_dir, cfg.disk_bytes) == ("/ssd/a", 32 * MIB)  # 4 x the segment
    monkeypatch.setenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/ssd/env")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "1GB")
    cfg = from_dict({"local_hostname": "h", "metadata_server": "m", "global_segment_size": "8MB",
                     "enable_ssd_offload": "true"})
    assert (cfg.disk_dir, cfg.disk_bytes) == ("/ssd/env", 1 << 30)
    assert build(*args, ssd_offload_path="/ssd/a").disk_dir == ""  # not enabled: no disk tier


def test_setup_signature_errors_are_type_errors_naming_the_argument():
    # SGLang retries setup without a keyword whose name the TypeError mentions
    with pytest.raises(TypeError, match="no_such_option"):
        build("h", "m", 0, 0, "tcp", "", "a:1", no_such_option=1)
    with pytest.raises(TypeError):
        build("h", "m", 0)


def test_setup_dict_reads_text_and_defaults():
    cfg = from_dict({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE",
                     "global_segment_size": "64 MB", "master_server_addr": "127.0.0.1:9",
                     "unknown_key": "ignored"})
    assert cfg.global_segment_bytes == 64 * MIB and cfg.local_buffer_bytes == 16 * MIB
    assert cfg.transport == "tcp" and cfg.tenant == "default"
    for missing in ("local_hostname", "metadata_server"):
        values = {"local_hostname": "h", "metadata_server": "m"}
        del values[missing]
        with pytest.raises(SetupError) as info:
            from_dict(values)
        assert info.value.code == ErrorCode.INVALID_PARAMS
    with pytest.raises(SetupError):
        from_dict({"local_hostname": "h", "metadata_server": "m", "global_segment_size": "10%"})


def test_code_table():
    assert code_for(Status.OK) == 0
    assert code_for(Status.NOT_FOUND) == -704
    assert code_for(Status.ALREADY_EXISTS) == -705
    assert code_for(Status.NO_SPACE) == -200
    assert code_for(Status.INVALID) == -600
    assert code_for(Status.UNAVAILABLE) == -800
    assert code_for(NotFound("k")) == -704
    assert code_for(AlreadyExists("k")) == -705
    assert code_for(NoSpace("x")) == -200
    assert code_for(InvalidArgument("x")) == -600
    assert code_for(BufferTooSmall("x", 10)) == -600
    assert code_for(Unavailable("x")) == -900
    assert code_for(Timeout("x")) == -901
    assert code_for(IntegrityError("x")) == -801
    assert code_for(CellarError("x")) == -1
    assert code_for(RuntimeError("x")) == -1
    assert code_for(99) == -1
    # a put of an existing key is a success for Mooncake; nothing else becomes 0
    assert put_code(Status.ALREADY_EXISTS) == 0 and put_code(AlreadyExists("k")) == 0
    assert [c for _, c in TABLE_ROWS if c == 0] == [ErrorCode.OK]
    assert all(code < 0 for st in Status if st != Status.OK for code in [code_for(st)])


def test_replicate_config_options():
    """Mooncake 0.3.13's fields, with Cellar's semantics (cellar.compat.mooncake.config)."""
    assert write_options(None) == WriteOptions()
    cfg = ReplicateConfig()
    assert (cfg.replica_num, cfg.with_soft_pin, cfg.preferred_segment) == (1, False, "")
    assert (cfg.soft_pin_action, cfg.soft_pin_ttl_ms, cfg.group_ids) == (SoftPinAction.PRESERVE,
                                                                          None, None)
    cfg.replica_num, cfg.with_soft_pin = 2, True  # Mooncake <= 0.3.12: a soft pin, no lapse
    assert write_options(cfg) == WriteOptions(replicas=2, soft_pin=True)
    enable = ReplicateConfig()
    enable.soft_pin_action = SoftPinAction.ENABLE
    assert write_options(enable) == WriteOptions(soft_pin=True,
                                                 soft_pin_ttl_ms=DEFAULT_SOFT_PIN_TTL_MS)
    enable.soft_pin_ttl_ms = 1000
    assert write_options(enable).soft_pin_ttl_ms == 1000
    enable.soft_pin_ttl_ms = 0  # an explicit 0 commits the object as ordinary cache
    assert write_options(enable) == WriteOptions()
    hard = ReplicateConfig()
    hard.with_hard_pin = True
    hard.preferred_segments = ["b:2"]
    hard.preferred_segment = "a:1"
    assert write_options(hard) == WriteOptions(hard_pin=True, preferred_segments=("a:1", "b:2"))
    local = ReplicateConfig()
    local.prefer_alloc_in_same_node = True
    assert write_options(local).local
    grouped = ReplicateConfig()
    grouped.group_ids, grouped.data_type = ["g", ""], 1  # accepted: per-object in Cellar
    assert write_options(grouped, keys=2) == WriteOptions()
    for attr, value, code in [("nof_replica_num", 1, ErrorCode.NOT_SUPPORTED),
                              ("preferred_nof_segments", ["n:1"], ErrorCode.NOT_SUPPORTED),
                              ("dfs_replica_num", 1, ErrorCode.NOT_SUPPORTED),
                              ("soft_pin_ttl_ms", 1000, ErrorCode.INVALID_PARAMS),  # PRESERVE
                              ("group_ids", ["g", "h"], ErrorCode.INVALID_PARAMS),  # 2 for 1 key
                              ("replica_num", 0, ErrorCode.INVALID_PARAMS),
                              ("replica_num", "2", ErrorCode.INVALID_PARAMS)]:
        bad = ReplicateConfig()
        setattr(bad, attr, value)
        with pytest.raises(OptionError) as info:
            write_options(bad)
        assert info.value.code == code, attr
    for action in (SoftPinAction.DISABLE, SoftPinAction.ENABLE):
        bad = ReplicateConfig()
        bad.soft_pin_action, bad.soft_pin_ttl_ms = action, MAX_SOFT_PIN_TTL_MS + 1
        with pytest.raises(OptionError):
            write_options(bad)
    both = ReplicateConfig()
    both.prefer_alloc_in_same_node, both.replica_num = True, 2
    with pytest.raises(OptionError):
        write_options(both)  # Mooncake: local-first allocation takes one replica
    for bad_ttl in (-1, 1 << 64, 1.5, True):
        with pytest.raises(TypeError):
            ReplicateConfig().soft_pin_ttl_ms = bad_ttl  # as Mooncake's uint64 binding
    with pytest.raises(AttributeError):
        ReplicateConfig().session_ids = ["s"]  # not a Mooncake 0.3.13 field: refused
    assert "replica_num: 2" in str(cfg)


def test_lease_parts_checks_every_piece_against_the_registrations():
    reg = PointerRegistry()
    buf = (ctypes.c_ubyte * 4096)()
    base = ctypes.addressof(buf)
    reg.register(base, 4096)
    ptr_lists = [[base, base + 100], [base + 4000], [base - 1], [base, 0], [], "x", [base]]
    size_lists = [[10, 50], [97], [2], [1, 1], [], "x", [1, 2]]
    with lease_parts(reg, ptr_lists, size_lists, writable=True) as per_key:
        first = per_key[0]
        assert isinstance(first, list) and [v.nbytes for v in first] == [10, 50]
        first[1][:] = b"y" * 50
        # past the end, before the start, a null pointer, no pieces, not lists, lengths differ
        assert per_key[1:] == [INVALID] * 6
        with pytest.raises(InvalidArgument):
            reg.unregister(base)  # held while the lease lives
    assert bytes(buf[100:150]) == b"y" * 50 and bytes(buf[99:100]) == b"\0"
    reg.unregister(base)
    with lease_parts(reg, [[base]], [[1]], writable=False) as per_key:
        assert per_key == [INVALID]


def test_buffer_handle_exports_its_bytes_at_a_stable_address():
    handle = BufferHandle(16)
    handle[:] = bytes(range(16))
    assert handle.size() == len(handle) == 16
    assert ctypes.string_at(handle.ptr(), 16) == bytes(range(16))
    assert bytes(memoryview(handle)) == bytes(range(16))
    with pytest.raises(BufferError):
        handle.extend(b"more")  # the address may not move


@pytest.mark.parametrize("pattern,expected", [
    (".*", ("all", "")), ("^", ("all", "")), ("", ("all", "")), ("^.*$", ("all", "")),
    ("^user_session_", ("prefix", "user_session_")), ("^user_session_.*", ("prefix", "user_session_")),
    ("^a/b-c:d.*$", ("prefix", "a/b-c:d")), (r"^v1\.page\.", ("prefix", "v1.page.")),
    ("^exact_key$", ("exact", "exact_key")),
    ("session", ("other", "")), ("^a.b", ("other", "")), ("^a|b", ("other", "")),
    ("^a+", ("other", "")), (r"^\d", ("other", "")), ("^[ab]", ("other", "")),
])
def test_regex_patterns_cellar_can_serve(pattern, expected):
    assert _literal_pattern(pattern) == expected


class _Listing:
    """What `io.remove_matching` uses of a Client: pages of sorted keys, batched removes."""

    def __init__(self, keys: list[str], page_keys: int, fail_on_page: int = -1) -> None:
        self.keys = sorted(keys)
        self.limits: Any = type("L", (), {"max_list_keys": page_keys})()
        self.pages = 0
        self.removed: list[list[str]] = []
        self.fail_on_page = fail_on_page

    def list_keys(self, prefix: str = "", *, start_after: str = "", limit: int = 1000) -> list[str]:
        if self.pages == self.fail_on_page:
            raise Unavailable("master gone")
        self.pages += 1
        return [k for k in self.keys if k > start_after][:limit]

    def remove_many(self, keys: list[str]) -> list[bool]:
        self.removed.append(list(keys))
        gone = set(keys)
        self.keys = [k for k in self.keys if k not in gone]
        return [True] * len(keys)


def test_a_pattern_no_prefix_serves_is_searched_page_by_page():
    keys = [f"doc/{i:02d}" for i in range(7)] + [f"img/{i:02d}" for i in range(5)]
    listing = _Listing(keys, page_keys=4)
    assert io.remove_matching(listing, re.compile(r"/0[13579]$")) == 5  # type: ignore[arg-type]
    assert listing.pages == 4  # three full pages of 4, then an empty one says it ended
    assert sorted(k for batch in listing.removed for k in batch) == [
        "doc/01", "doc/03", "doc/05", "img/01", "img/03"]
    assert all(len(batch) <= 4 for batch in listing.removed)  # one batch per page at most
    assert len(listing.keys) == 7


def test_a_listing_that_fails_midway_gives_its_code_and_keeps_what_was_removed():
    listing = _Listing([f"k{i}" for i in range(6)], page_keys=2, fail_on_page=1)
    assert io.remove_matching(listing, re.compile("k")) == code_for(Unavailable("x"))  # type: ignore[arg-type]
    assert listing.removed == [["k0", "k1"]]


def test_segment_names_split_into_host_and_port():
    assert split_segment("127.0.0.1") == ("127.0.0.1", 0)
    assert split_segment("localhost:12345") == ("localhost", 12345)
    assert split_segment("[::1]:5") == ("::1", 5)
    assert _listen_host("") == "127.0.0.1"


def test_setup_takes_every_argument_by_position_as_pybind_does():
    # SGLang passes the transfer engine (None) as the eighth positional argument
    cfg = build("h", "P2PHANDSHAKE", 0, "1MB", "tcp", "", "127.0.0.1:9", None, False, "", "t2")
    assert cfg.tenant == "t2" and cfg.local_buffer_bytes == MIB
