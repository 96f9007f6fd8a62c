"""The documented opt-in for code that imports Mooncake and cannot change: the shim written by
`python -m cellar.compat.mooncake.shim DIR` serves `mooncake.store` to a process that has DIR on
its PYTHONPATH, and to no other."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cellar.compat.mooncake.shim import write_shim

PROGRAM = """
import sys
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
store = MooncakeDistributedStore()
assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, "16MB", "tcp", "", sys.argv[1]) == 0
cfg = ReplicateConfig()
assert store.put("shim/key", b"through the shim", cfg) == 0
print(store.get("shim/key").decode())
store.close()
"""


def _run(args: list[str], pythonpath: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_shim_serves_mooncake_store_to_the_process_that_asks(make_cluster, tmp_path):
    cluster = make_cluster(nodes=1)
    shim = tmp_path / "shim"
    made = _run(["-m", "cellar.compat.mooncake.shim", str(shim)], None)
    assert made.returncode == 0, made.stderr
    got = _run(["-c", PROGRAM, cluster.address], str(shim))
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "through the shim"
    without = _run(["-c", "import mooncake.store"], None)
    assert without.returncode != 0 and "No module named 'mooncake'" in without.stderr


def test_shim_never_overwrites_a_package_it_did_not_write(tmp_path):
    (tmp_path / "mooncake").mkdir()
    (tmp_path / "mooncake" / "store.py").write_text("# a real Mooncake file\n")
    with pytest.raises(FileExistsError):
        write_shim(tmp_path)
    assert (tmp_path / "mooncake" / "store.py").read_text() == "# a real Mooncake file\n"
    write_shim(tmp_path / "again")
    write_shim(tmp_path / "again")  # its own files: rewritten
