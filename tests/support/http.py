"""`post_json`: a JSON POST to a local cluster's master HTTP port with a bearer token; the
status and the decoded reply (error replies included)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
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
