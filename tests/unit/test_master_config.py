"""MasterConfig validation and the cluster secret resolution (cellar/secret.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cellar.config import load, render
from cellar.errors import ConfigError
from cellar.master.config import ENV_PREFIX, MasterConfig
from cellar.proto.tiers import MOVE_DEADLINE_MARGIN_S
from cellar.secret import ENV_SECRET, load_cluster_secret


def test_defaults_are_valid_and_match_the_spec() -> None:
    config, _ = load(MasterConfig, env_prefix=ENV_PREFIX, environ={})
    assert (config.max_key_bytes, config.max_batch_keys, config.max_replicas) == (1024, 1024, 8)
    assert (config.pin_ttl_s, config.write_grant_ttl_s, config.grant_skew_s) == (10, 30, 1)
    assert (config.node_suspect_after_s, config.node_expire_after_s) == (3, 10)
    assert (config.eviction_high_watermark, config.eviction_low_watermark) == (0.90, 0.85)
    assert config.grpc_max_message_bytes == 4 << 20
    assert (config.listen, config.http) == ("127.0.0.1:50051", "127.0.0.1:9400")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"eviction_high_watermark": 0.5}, "eviction_high_watermark"),
        ({"eviction_low_watermark": 0}, "eviction_low_watermark"),
        ({"node_expire_after_s": 2}, "node_expire_after_s"),
        ({"max_key_bytes": "lots"}, "max_key_bytes"),
        ({"grpc_max_message_bytes": "1KiB"}, "grpc_max_message_bytes"),
        ({"listen": "nowhere"}, "listen"),
        ({"default_replicas": 9}, "default_replicas"),
        ({"tenants": {"x": {"quota_bytes": "4XB"}}}, "tenants"),
    ],
)
def test_invalid_values_name_the_field(overrides, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        load(MasterConfig, env_prefix=ENV_PREFIX, environ={}, overrides=overrides)
    assert info.value.field == field


def test_tier_move_timeout_below_what_a_node_can_carry_out_is_refused() -> None:
    """A node skips a tier move with less than MOVE_DEADLINE_MARGIN_S left (storage_node/
    disk_tier.py), and a move may wait heartbeat_interval_s for the heartbeat that carries it:
    a shorter tier_move_timeout_s (0.1 s was accepted) got every move, or most, skipped."""
    def with_(timeout_s: float, heartbeat_s: float) -> MasterConfig:
        config, _ = load(MasterConfig, env_prefix=ENV_PREFIX, environ={}, overrides={
            "tier_move_timeout_s": timeout_s, "heartbeat_interval_s": heartbeat_s})
        return config

    least_s = MOVE_DEADLINE_MARGIN_S + 1.0
    assert with_(least_s, 1.0).tier_move_timeout_s == least_s
    for timeout_s, heartbeat_s in ((0.1, 1.0), (least_s - 0.01, 1.0), (least_s, 1.5)):
        with pytest.raises(ConfigError) as info:
            with_(timeout_s, heartbeat_s)
        assert info.value.field == "tier_move_timeout_s"
        floor_s = MOVE_DEADLINE_MARGIN_S + heartbeat_s
        assert f"{timeout_s:g} s is below the minimum of {floor_s:g} s" in str(info.value)


def test_layers_and_sizes(tmp_path: Path) -> None:
    file = tmp_path / "master.toml"
    file.write_text('max_key_bytes = "2KiB"\npin_ttl_s = "500ms"\n[tenants.team]\nquota_bytes = "1GiB"\n')
    config, sources = load(MasterConfig, env_prefix=ENV_PREFIX, file=file,
                           environ={"CELLAR_MASTER_PIN_TTL_S": "2s"})
    assert config.max_key_bytes == 2048
    assert config.pin_ttl_s == 2.0 and sources["pin_ttl_s"].startswith("env")
    assert config.tenant_quotas()["team"].quota_bytes == 1 << 30
    text = render(config, sources)
    for name in ("max_key_bytes", "pin_ttl_s", "tenants", "grpc_max_message_bytes"):
        assert name in text


def test_secret_from_environment_wins(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("ab" * 32)
    assert load_cluster_secret(str(path), environ={ENV_SECRET: "cd" * 16}) == bytes([0xCD]) * 16
    assert load_cluster_secret(str(path), environ={}) == bytes([0xAB]) * 32
    with pytest.raises(ConfigError, match=ENV_SECRET):
        load_cluster_secret(None, environ={ENV_SECRET: "abcd"})
    with pytest.raises(ConfigError, match=ENV_SECRET):
        load_cluster_secret(None, environ={ENV_SECRET: "zz" * 32})


def test_named_secret_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cluster_secret_file"):
        load_cluster_secret(str(tmp_path / "missing"), environ={})


def test_default_secret_is_created_private_once(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HOME", str(tmp_path))
    first = load_cluster_secret(None, environ={})
    path = tmp_path / ".cellar" / "cluster-secret"
    assert len(first) == 32 and path.exists()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_cluster_secret(None, environ={}) == first
    assert [p.name for p in path.parent.iterdir()] == ["cluster-secret"]  # no temp files left
