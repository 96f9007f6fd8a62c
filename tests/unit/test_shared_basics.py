"""Units, config layering, errors and grants: the pieces every part shares."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from cellar import config as cfg
from cellar.errors import (
    AlreadyExists,
    ConfigError,
    InvalidArgument,
    NotFound,
    Status,
    error_for_status,
)
from cellar.proto import cellar_pb2
from cellar.proto.grant import (
    GRANT_OP_READ,
    GRANT_OP_WRITE,
    GrantRejected,
    key_tag,
    sign,
    verify,
)
from cellar.units import format_size, parse_duration_s, parse_host_port, parse_size_bytes

SECRET = b"s" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4GiB", 4 << 30), ("64KiB", 64 << 10), ("1.5MB", 1_500_000), ("4096", 4096), (17, 17),
     (" 2 mib ", 2 << 20)],
)
def test_parse_size(text, expected):
    assert parse_size_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "4XB", "-1GiB", "four", True])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size_bytes(text)


def test_durations_and_formats():
    assert parse_duration_s("500ms") == 0.5
    assert parse_duration_s("2m") == 120.0
    assert parse_duration_s(3) == 3.0
    with pytest.raises(ValueError):
        parse_duration_s("3 parsecs")
    assert format_size(4 << 30) == "4GiB"
    assert format_size(1536) == "1.50KiB"
    assert parse_host_port("127.0.0.1:50051") == ("127.0.0.1", 50051)
    assert parse_host_port(":9") == ("127.0.0.1", 9)
    assert parse_host_port("[::1]:7") == ("::1", 7)
    with pytest.raises(ValueError):
        parse_host_port("localhost")


def test_status_numbers_match_proto():
    for status in Status:
        assert cellar_pb2.Status.Value(status.name) == status.value
    assert isinstance(error_for_status(Status.NOT_FOUND, "k"), NotFound)
    assert isinstance(error_for_status(Status.ALREADY_EXISTS), AlreadyExists)
    assert isinstance(error_for_status(Status.INVALID, "bad"), InvalidArgument)


@dataclasses.dataclass
class DemoConfig:
    size_bytes: int = cfg.setting(1 << 20, "segment size", unit=cfg.UNIT_BYTES)
    ttl_s: float = cfg.setting(10.0, "pin ttl", unit=cfg.UNIT_SECONDS)
    name: str = cfg.setting("x", "a name")
    fast: bool = cfg.setting(False, "go fast")
    mode: str = cfg.setting("a", "mode", choices=("a", "b"))

    def validate(self) -> None:
        cfg.require(self.size_bytes > 0, "size_bytes", "must be positive")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser, DemoConfig)
    return parser.parse_args(argv)


def test_config_layers_in_order(tmp_path: Path):
    file = tmp_path / "c.toml"
    file.write_text('size_bytes = "2MiB"\nttl_s = "1s"\nname = "from-file"\n')
    env = {"CELLAR_DEMO_TTL_S": "250ms", "CELLAR_DEMO_NAME": "from-env"}
    conf, sources = cfg.load(DemoConfig, env_prefix="CELLAR_DEMO_",
                             args=_parse(["--config", str(file), "--name", "from-flag"]),
                             environ=env)
    assert conf.size_bytes == 2 << 20 and sources["size_bytes"].startswith("file")
    assert conf.ttl_s == 0.25 and sources["ttl_s"].startswith("env")
    assert conf.name == "from-flag" and sources["name"].startswith("flag")
    assert conf.fast is False and sources["fast"] == "default"
    listing = cfg.render(conf, sources)
    for field in dataclasses.fields(DemoConfig):
        assert field.name in listing


def test_config_yaml_and_errors_name_the_field(tmp_path: Path):
    file = tmp_path / "c.yaml"
    file.write_text("fast: true\nmode: b\n")
    conf, _ = cfg.load(DemoConfig, env_prefix="X_", file=file, environ={})
    assert conf.fast is True and conf.mode == "b"
    bad = [({"X_SIZE_BYTES": "lots"}, "size_bytes"), ({"X_FAST": "maybe"}, "fast"),
           ({"X_MODE": "c"}, "mode"), ({"X_SIZE_BYTES": "0"}, "size_bytes")]
    for environ, field in bad:
        with pytest.raises(ConfigError) as info:
            cfg.load(DemoConfig, env_prefix="X_", environ=environ)
        assert info.value.field == field
    unknown = tmp_path / "u.toml"
    unknown.write_text("colour = 1\n")
    with pytest.raises(ConfigError, match="colour"):
        cfg.load(DemoConfig, env_prefix="X_", file=unknown, environ={})


def _grant(**overrides):
    fields = dict(op=GRANT_OP_WRITE, segment_id=7, offset=4096, length=1000, alloc_id=3,
                  epoch=5, expiry_ms=10_000, tag=key_tag("default", "k"))
    fields.update(overrides)
    return sign(SECRET, **fields)


def test_grant_accepts_exact_and_inner_ranges():
    grant = _grant()
    verify(SECRET, grant, op=GRANT_OP_WRITE, segment_id=7, offset=4096, length=1000, now_ms=9_000)
    verify(SECRET, grant, op=GRANT_OP_WRITE, segment_id=7, offset=5000, length=96, now_ms=9_000)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (dict(op=GRANT_OP_READ), GrantRejected.WRONG_OP),
        (dict(offset=4095), GrantRejected.OUT_OF_RANGE),
        (dict(length=1001), GrantRejected.OUT_OF_RANGE),
        (dict(segment_id=8), GrantRejected.OUT_OF_RANGE),
        (dict(now_ms=10_001), GrantRejected.EXPIRED),
        (dict(min_epoch=6), GrantRejected.STALE_EPOCH),
    ],
)
def test_grant_rejections(kwargs, reason):
    request = dict(op=GRANT_OP_WRITE, segment_id=7, offset=4096, length=1000, now_ms=9_000)
    request.update(kwargs)
    with pytest.raises(GrantRejected) as info:
        verify(SECRET, _grant(), **request)
    assert info.value.reason == reason


def test_forged_or_stretched_grant_fails_mac():
    grant = _grant()
    stretched = dataclasses.replace(grant, length=1 << 30)
    with pytest.raises(GrantRejected, match="bad_mac"):
        verify(SECRET, stretched, op=GRANT_OP_WRITE, segment_id=7, offset=4096, length=1 << 20,
               now_ms=0)
    with pytest.raises(GrantRejected, match="bad_mac"):
        verify(b"t" * 32, grant, op=GRANT_OP_WRITE, segment_id=7, offset=4096, length=10, now_ms=0)
    assert key_tag("a", "k") != key_tag("b", "k")
