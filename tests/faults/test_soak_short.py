"""The soak in its short form: 60 s of random checksummed traffic from 4 client processes while
the chaos loop kills, stops and restarts nodes and the master (`make soak` runs 10 minutes).
It must end with no corrupt read and no unexplained loss (exit 0), having injected faults of
every kind and done real work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK_S = 60
MIN_OPS = 200          # ~10^4 on an idle 2-core machine; this only proves traffic flowed
MIN_FAULT_KINDS = 3


@pytest.mark.timeout(SOAK_S + 240)
def test_soak_short(tmp_path: Path) -> None:
    report_path = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, "-m", "cellar", "soak", "--duration", f"{SOAK_S}s", "--clients", "4",
         "--nodes", "3", "--report", str(report_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=SOAK_S + 220, check=False)
    output = proc.stdout.decode(errors="replace")
    print(output[-6000:])
    assert report_path.exists(), "the soak wrote no report"
    report = json.loads(report_path.read_text())
    assert proc.returncode == 0, f"soak failed: {report.get('failure')!r}, corrupt " \
        f"{report['corrupt_reads']}, lost {report['lost']}"
    assert report["corrupt_reads"] == 0
    assert report["lost"]["unexplained"] == 0
    assert len(report["faults"]) >= MIN_FAULT_KINDS, report["faults"]
    assert report["ops_total"] > MIN_OPS, report["ops"]
