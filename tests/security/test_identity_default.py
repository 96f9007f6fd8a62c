"""The embedded default still just works: `cellar up` (LocalCluster) makes the tokens, writes
them 0600, and the SDK and the CLI pick them up without a flag; CELLAR_TOKEN and token= win."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import cellar
from cellar.credentials import ENV_CREDENTIALS_DIR, credentials_path, default_token, file_name
from cellar.devtools.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    creds = tmp_path_factory.mktemp("credentials")
    old = os.environ.get(ENV_CREDENTIALS_DIR)
    os.environ[ENV_CREDENTIALS_DIR] = str(creds)  # instead of ~/.cellar/credentials
    try:
        with LocalCluster(1, "64MiB") as cluster:
            yield cluster, creds
    finally:
        if old is None:
            os.environ.pop(ENV_CREDENTIALS_DIR, None)
        else:
            os.environ[ENV_CREDENTIALS_DIR] = old


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("CELLAR_TOKEN", "CELLAR_ADMIN_TOKEN")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "cellar", *args], capture_output=True, text=True,
                          timeout=60, env=full)


def test_credentials_files_are_private_and_found_by_address(up: tuple[LocalCluster, Path]) -> None:
    cluster, creds = up
    for path in (creds / file_name(cluster.address),
                 cluster.run_dir / "credentials" / file_name(cluster.address)):
        assert (path.stat().st_mode & 0o777) == 0o600, path
        assert (path.parent.stat().st_mode & 0o077) == 0, path.parent
        value = json.loads(path.read_text())
        assert value["token"] == cluster.token and value["admin_token"] == cluster.admin_token
    assert (cluster.tokens_path.stat().st_mode & 0o777) == 0o600
    assert cluster.token not in cluster.tokens_path.read_text()
    assert default_token(cluster.address, {ENV_CREDENTIALS_DIR: str(creds)}) == cluster.token
    assert default_token(cluster.address, {ENV_CREDENTIALS_DIR: str(creds),
                                           "CELLAR_TOKEN": "mine"}) == "mine"
    os.chmod(credentials_path(cluster.address), 0o644)  # readable by others: ignored, like ssh
    try:
        assert default_token(cluster.address, {ENV_CREDENTIALS_DIR: str(creds)}) is None
    finally:
        os.chmod(credentials_path(cluster.address), 0o600)


def test_sdk_connects_without_a_token_and_overrides_win(up: tuple[LocalCluster, Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, _ = up
    with cellar.connect(cluster.address) as client:
        client.put("default/1", b"works")
        assert client.get("default/1") == b"works"
    other = cluster.token_for("other")
    monkeypatch.setenv("CELLAR_TOKEN", other)  # the environment beats the file
    with cellar.connect(cluster.address, tenant="other") as client, pytest.raises(cellar.NotFound):
        client.get("default/1")
    # "other" may not act as "default"
    with pytest.raises(cellar.PermissionDenied), cellar.connect(cluster.address) as client:
        client.get("default/1")
    with cellar.connect(cluster.address, token=cluster.token) as client:  # token= beats both
        assert client.get("default/1") == b"works"


def test_cli_commands_need_no_flag(up: tuple[LocalCluster, Path], tmp_path: Path) -> None:
    cluster, creds = up
    env = {ENV_CREDENTIALS_DIR: str(creds)}
    src = tmp_path / "in.bin"
    src.write_bytes(b"from the cli")
    assert _cli("put", "--master", cluster.address, "cli/1", str(src), env=env).returncode == 0
    got = _cli("get", "--master", cluster.address, "cli/1", env=env)
    assert got.returncode == 0 and got.stdout == "from the cli"
    assert _cli("status", "--master", cluster.address, env=env).returncode == 0
    refused = _cli("get", "--master", cluster.address, "cli/1", env={**env, "CELLAR_TOKEN": "nope"})
    assert refused.returncode != 0

    made = _cli("token", "create", "--master", cluster.address, "--tenant", "clitenant", env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("cellar_") and token not in made.stderr
    listed = _cli("token", "list", "--master", cluster.address, env=env)
    assert listed.returncode == 0 and "clitenant" in listed.stdout and token not in listed.stdout
    token_id = token.split("_")[1]
    assert _cli("token", "revoke", "--master", cluster.address, token_id, env=env).returncode == 0
    assert token_id not in _cli("token", "list", "--master", cluster.address, env=env).stdout
    # only an admin token manages tokens
    denied = _cli("token", "list", "--master", cluster.address, "--token", cluster.token, env=env)
    assert denied.returncode == 1 and "403" in denied.stderr


def test_token_store_bootstrap_offline(tmp_path: Path) -> None:
    store = tmp_path / "tokens.json"
    made = _cli("token", "create", "--store", str(store), "--admin", "--label", "first")
    assert made.returncode == 0, made.stderr
    assert (store.stat().st_mode & 0o777) == 0o600 and made.stdout.strip() not in store.read_text()
    listed = _cli("token", "list", "--store", str(store))
    assert "admin" in listed.stdout and "first" in listed.stdout


def test_stop_removes_the_per_user_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CREDENTIALS_DIR, str(tmp_path))
    with LocalCluster(1, "64MiB") as cluster:
        path = credentials_path(cluster.address)
        assert path.exists()
    assert not path.exists()
