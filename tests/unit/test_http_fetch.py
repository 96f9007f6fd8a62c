"""cellar.http_fetch: how an HTTP address names its scheme, and what a caller trusts."""

from __future__ import annotations

import ssl

import pytest

from cellar.http_fetch import advertised, base_url, context, host_port, is_tls


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
