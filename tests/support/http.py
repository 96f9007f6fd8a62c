"""`post_json`: a JSON POST to a local cluster's master HTTP port with a bearer token; the
status and the decoded reply (error replies included). `master_metric`: one sample of its
/metrics. `serving`: a `cellar.http.HttpServer` run on loopback by an event loop of its own in
a thread, for tests of the server itself."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def post_json(cluster: Any, path: str, body: Any, token: str | None) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.http_port}{path}", data=json.dumps(body).encode(),
        method="POST", headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def master_metric(cluster: Any, name: str) -> float:
    """One unlabelled sample of the master's /metrics (`name`, or `name_total`)."""
    with urllib.request.urlopen(cluster.http_url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    match = re.search(rf"^{name}(?:_total)? (\S+)$", text, re.M)
    assert match, f"{name} not in the master's /metrics"
    return float(match.group(1))


@contextmanager
def serving(http: Any, loop: asyncio.AbstractEventLoop,
            tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """`http` (its routes set) listening on 127.0.0.1 on `loop`, run by a thread; its port.
    Stopped, the loop closed, on the way out."""
    port = loop.run_until_complete(http.start("127.0.0.1", 0, tls))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(http.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
