"""The repository contract: generated code is fresh and nothing but `cellar` is importable."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_proto_code_is_fresh():
    result = subprocess.run([sys.executable, str(ROOT / "proto" / "_generate.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_only_the_cellar_package_is_importable():
    # run from a neutral folder so the repository's own folders are not on sys.path
    code = ("import importlib.util as u, cellar.master, cellar.client, cellar.transfer, "
            "cellar.storage_node, cellar.proto;"
            "print([m for m in ('master','client','proto','transfer','storage_node') "
            "if u.find_spec(m)])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd="/", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert importlib.util.find_spec("cellar.master") is not None


def test_master_and_node_do_not_load_client_code():
    code = ("import sys, cellar.master, cellar.storage_node;"
            "print(sorted(m for m in sys.modules if m.startswith('cellar.client')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd="/", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
