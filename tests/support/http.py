"""`post_json`: a JSON POST to a local cluster's master HTTP port with a bearer token; the
status and the decoded reply (error replies included). `master_metric`: one sample of its
/metrics."""

from __future__ import annotations

import json
import re
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


def master_metric(cluster: Any, name: str) -> float:
    """One unlabelled sample of the master's /metrics (`name`, or `name_total`)."""
    with urllib.request.urlopen(cluster.http_url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    match = re.search(rf"^{name}(?:_total)? (\S+)$", text, re.M)
    assert match, f"{name} not in the master's /metrics"
    return float(match.group(1))
