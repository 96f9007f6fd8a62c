"""How many pins a cluster's master holds (its /metrics `master_pin_count`): the SDK tests use
it to check that every read's pin is released."""

from __future__ import annotations

import time
import urllib.request
from typing import Any


def master_pin_count(cluster: Any) -> float:
    with urllib.request.urlopen(f"{cluster.http_url}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("master_pin_count "):
                return float(line.split()[1])
    raise AssertionError("master_pin_count not exported")


def pins_after_release(cluster: Any, wait_s: float = 5.0) -> float:
    """The pin count once it reaches 0, or what it still is after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while (pins := master_pin_count(cluster)) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return pins
