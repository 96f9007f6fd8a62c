"""Findings (review 2026-12-07): JSON bodies from any tenant token that stalled or broke the master.

One tenant's request stopped the whole master for minutes.

The HTTP server measures a JSON body's nesting (`cellar.http.json_depth`) before parsing it. Its
scan matched each string with a regex; a string that never closes, such as `"\\"\\"\\"...`,
failed at the end of the body and the scan started again at the next quote, inside it: work
quadratic in the body (16 KiB took 1 s, the 1 MiB the server admits about an hour), on the
master's one event loop, with any tenant token (`POST /api/v1/lookup`, `/query`). Every RPC,
the fast line and the other HTTP requests waited behind it.

Same review: a JSON integer too big for a float (`"bytes_per_s": 1e400` written out as digits)
in a lookup dropped the connection without a reply and logged a traceback per request
(`math.isfinite` raised OverflowError, which nothing caught); now a 400 naming the field.

Real master process (cellar.devtools.local_cluster): while the hostile body is being measured,
another caller's /health must be answered (the port still serves others), and the hostile
request gets its 400. No latency is asserted: the client timeouts only bound how long the test
waits for an answer that, before the fix, came minutes later.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from cellar.devtools.local_cluster import LocalCluster
from cellar.http import MAX_JSON_DEPTH, json_depth

# 256 KiB of escaped quotes in a string that never closes: minutes of scanning before the fix
HOSTILE = b'{"keys": ["' + b'\\"' * (128 << 10)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "64MiB") as c:
        yield c


def _send(url: str, path: str, token: str, body: bytes) -> socket.socket:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=120)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def _reply(sock: socket.socket) -> bytes:
    reply = b""
    with sock:
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_an_unclosed_string_of_escaped_quotes_does_not_stall_the_master(
        cluster: LocalCluster) -> None:
    hostile = _send(cluster.http_url, "/api/v1/lookup", cluster.token, HOSTILE)
    time.sleep(1.0)  # order only: the master has read the body (before the fix: now scanning it)
    with urllib.request.urlopen(cluster.http_url + "/health", timeout=20) as reply:
        assert reply.status == 200  # another caller is served meanwhile
    answer = _reply(hostile)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]


@pytest.mark.parametrize("body, depth", [
    (b'["a", {"b": "[[[{"}]', 2),          # brackets inside strings do not count
    (b'["\\"[", ["\\\\"]]', 2),              # an escaped quote does not end a string
    (b'[["' + b'\\"' * 1000, 2),             # an unclosed string: counted up to it
    (b'["' + b'[' * 100, 1),                 # ... and nothing inside it counts
    (b'[' * (MAX_JSON_DEPTH + 1), MAX_JSON_DEPTH + 1),
])
def test_json_depth_counts_what_json_would_nest(body: bytes, depth: int) -> None:
    assert json_depth(body) == depth


BIG = 10 ** 400  # a JSON integer: Python's json makes it an int no float can hold


@pytest.mark.parametrize("extra", [
    {"bytes_per_s": BIG}, {"rtt_s": BIG}, {"bytes_per_s": 1e9, "rtt_s": -BIG},
    {"prefill_tokens_per_s": BIG, "tokens_per_key": 16},
])
def test_a_number_too_big_for_a_float_is_a_400(cluster: LocalCluster, extra: dict) -> None:
    """Finding (same review): `math.isfinite` of such an int raised OverflowError, which no one
    caught: the connection was dropped without a reply and the master logged a traceback per
    request ("Unhandled exception in client_connected_cb"), from any tenant token."""
    body = json.dumps({"keys": ["k"], **extra}).encode()
    answer = _reply(_send(cluster.http_url, "/api/v1/lookup", cluster.token, body))
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"must be a number" in answer


@pytest.mark.parametrize("quota", ["1e400GiB", "9" * 400 + "GiB"])
def test_a_quota_past_a_float_is_a_400_and_changes_nothing(cluster: LocalCluster,
                                                           quota: str) -> None:
    """Finding (same review): `parse_size_bytes` turned such a size into float infinity and
    `int()` of it raised OverflowError: PUT /api/v1/tenants dropped the connection unanswered
    (and a config file with it failed with a traceback instead of a ConfigError)."""
    body = json.dumps({"name": "overflow", "quota_bytes": quota}).encode()
    answer = _reply(_send(cluster.http_url, "/api/v1/tenants", cluster.admin_token, body))
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"not a size" in answer
    tenants = cluster.admin_request("GET", "/api/v1/tenants")
    assert "overflow" not in {t["name"] for t in tenants}
