"""The storage node never loads the SDK or the master (DESIGN: one-way dependencies)."""

from __future__ import annotations

import subprocess
import sys


def test_node_imports_neither_client_nor_master() -> None:
    code = ("import sys, cellar.storage_node.main, cellar.storage_node.node\n"
            "bad = [m for m in sys.modules if m.startswith(('cellar.client', 'cellar.master'))]\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
