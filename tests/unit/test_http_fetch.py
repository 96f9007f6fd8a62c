"""cellar.http_fetch: how an HTTP address names its scheme, and what a caller trusts."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest

from cellar.credentials import write_private_json
from cellar.http_fetch import advertised, base_url, context, default_ca, host_port, is_tls


@pytest.mark.parametrize(("address", "url", "bare", "tls"), [
    ("127.0.0.1:9400", "http://127.0.0.1:9400", "127.0.0.1:9400", False),
    ("http://10.0.0.2:9400", "http://10.0.0.2:9400", "10.0.0.2:9400", False),
    ("https://master-0:9400", "https://master-0:9400", "master-0:9400", True),
    ("https://[::1]:9400/", "https://[::1]:9400", "[::1]:9400", True),
])
def test_an_address_keeps_its_scheme(address: str, url: str, bare: str, tls: bool) -> None:
    assert base_url(address) == url
    assert host_port(address) == bare
    assert is_tls(address) is tls


def test_a_server_names_itself_with_https_only_when_it_serves_tls() -> None:
    assert advertised("127.0.0.1", 9400, False) == "127.0.0.1:9400"
    assert advertised("127.0.0.1", 9400, True) == "https://127.0.0.1:9400"
    assert is_tls(advertised("h", 1, True)) and not is_tls(advertised("h", 1, False))


def test_https_is_verified_and_plain_http_gets_no_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELLAR_TLS_CA", raising=False)
    assert context("127.0.0.1:9400") is None
    tls = context("https://127.0.0.1:9400")
    assert tls is not None
    assert tls.verify_mode == ssl.CERT_REQUIRED and tls.check_hostname
    assert tls.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_an_https_port_finds_its_ca_in_the_credentials_that_name_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELLAR_CREDENTIALS_DIR", str(tmp_path))
    monkeypatch.delenv("CELLAR_TLS_CA", raising=False)
    write_private_json(tmp_path / "127.0.0.1_50051.json",
                       {"token": "t", "http": ["https://127.0.0.1:9400"], "tls_ca": "/ca/one.pem"})
    write_private_json(tmp_path / "10.0.0.9_50051.json",
                       {"http": "10.0.0.9:9400", "tls_ca": "/ca/two.pem"})
    loose = tmp_path / "127.0.0.2_50051.json"  # not private: never trusted
    loose.write_text(json.dumps({"http": ["https://127.0.0.2:9400"], "tls_ca": "/ca/evil.pem"}))
    loose.chmod(0o644)
    assert default_ca("https://127.0.0.1:9400") == "/ca/one.pem"
    assert default_ca("https://10.0.0.9:9400") == "/ca/two.pem"  # written without its scheme
    assert default_ca("https://127.0.0.2:9400") is None
    assert default_ca("https://127.0.0.1:9401") is None  # another port: the system's store
    monkeypatch.setenv("CELLAR_TLS_CA", "/ca/env.pem")
    assert default_ca("https://127.0.0.1:9400") == "/ca/env.pem"  # the environment first
