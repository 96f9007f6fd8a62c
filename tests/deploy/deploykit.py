"""Shared helpers of the deployment tests (tests/deploy/), imported as `deploykit`.

`require_tool(name)`: the path of an external program (promtool, chromium, ...). Missing, the
test is skipped on a developer's machine but FAILS under CI=true, since .ci/run installs
every tool these tests need (apt-get prometheus chromium chromium-driver).
`print_config(argv, env)`: runs `cellar <argv> --print-config` for real and returns the
settings it printed, so a flag or environment variable the code does not know fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
IN_CI = os.environ.get("CI", "").lower() == "true"


def require_tool(name: str, *alternatives: str) -> str:
    for candidate in (name, *alternatives):
        path = shutil.which(candidate)
        if path:
            return path
    message = f"{name} is not installed (apt-get install it; .ci/run does)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def print_config(argv: list[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`cellar ARGV --print-config` with exactly `env` (plus PATH): {setting: value text}."""
    full_env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
                **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "cellar", *argv, "--print-config"],
                          capture_output=True, text=True, env=full_env, timeout=60)
    assert proc.returncode == 0, f"cellar {' '.join(argv)} --print-config failed:\n{proc.stderr}"
    settings = {}
    for line in proc.stdout.splitlines():
        name, sep, rest = line.partition(" = ")
        if sep:
            settings[name.strip()] = rest.split("  ", 1)[0].strip()
    assert settings, proc.stdout
    return settings
