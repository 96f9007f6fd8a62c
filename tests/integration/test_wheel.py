"""The wheel installs and works on its own, as a new user gets it (issue 11, part 1).

The test builds the `cellar-kv` wheel from a copy of the source tree, installs it with
`--no-deps` into a temporary target outside the source tree, and then, from a folder that is not
the repository, with the base interpreter and PYTHONPATH = that target + this venv's
site-packages (for the dependencies only: a plain PYTHONPATH entry processes no `.pth` file, so
the editable install's finder, which would quietly serve a module the wheel lacks from the
source tree, never loads):
- imports every module the wheel holds, and checks each one came from the target;
- checks that no top-level `master`, `client`, `proto`, ... landed beside `cellar`;
- runs `cellar --help` through the installed entry point;
- starts a master and a node from that install (`LocalCluster`, which runs `python -m cellar`)
  and does one put/get against them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)
# What the build copies: everything but tests, caches, the venv and build leftovers.
_IGNORE = shutil.ignore_patterns(".git", ".venv", "tests", "build", "dist", "*.egg-info",
                                 "__pycache__", ".cellar", ".pytest_cache", ".mypy_cache",
                                 ".ruff_cache", "results")
# Top-level names that must never be importable from site-packages.
_FORBIDDEN_TOP_LEVEL = ("master", "client", "proto", "transfer", "storage_node", "bench",
                        "integrations", "compat")

_CHECK = r'''
import importlib, json, pathlib, sys
target = pathlib.Path(sys.argv[1]).resolve()
names = sorted(
    ".".join(p.relative_to(target).with_suffix("").parts).removesuffix(".__init__")
    for p in (target / "cellar").rglob("*.py") if p.name != "__main__.py")
# The engine adapters import their engine, which the wheel does not install (an extra).
optional = {"sglang", "lmcache"}
bad = {}
for name in names:
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in optional:
            bad[name] = repr(e)
        continue
    except Exception as e:  # report every module that fails, not just the first
        bad[name] = repr(e)
        continue
    where = pathlib.Path(mod.__file__).resolve()
    if target not in where.parents:
        bad[name] = f"imported from {where}, not from the installed wheel"
import importlib.util as u
stray = [m for m in sys.argv[2].split(",") if u.find_spec(m)]
print(json.dumps({"modules": len(names), "bad": bad, "stray": stray}))
'''

_ROUNDTRIP = r'''
import sys, cellar
from cellar.devtools.local_cluster import LocalCluster
with LocalCluster(1, "64MiB") as cluster:
    with cellar.connect(cluster.address) as client:
        client.put("wheel/key", b"from the wheel" * 1000)
        assert client.get("wheel/key") == b"from the wheel" * 1000
print("roundtrip ok", cellar.__file__)
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target folder the wheel was installed into (--no-deps)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=_IGNORE)
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(src)], check=True, timeout=300,
                   capture_output=True)
    wheels = list(dist.glob("cellar_kv-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as z:
        tops = {n.split("/", 1)[0] for n in z.namelist()}
    assert all(t == "cellar" or t.endswith(".dist-info") for t in tops), tops
    target = work / "target"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheels[0])], check=True, timeout=300, capture_output=True)
    return target


def _env(target: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]])
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(target: Path, argv: list[str], cwd: Path, timeout_s: float) -> str:
    result = subprocess.run([BASE_PYTHON, *argv], cwd=cwd, env=_env(target),
                            capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_every_module_of_the_wheel_imports_from_the_target(installed: Path,
                                                          tmp_path: Path) -> None:
    import json

    out = json.loads(_run(installed, ["-c", _CHECK, str(installed),
                                      ",".join(_FORBIDDEN_TOP_LEVEL)], tmp_path, 180))
    assert out["bad"] == {}
    assert out["stray"] == []
    assert out["modules"] > 50  # the whole SDK, master, node, transfer, proto, bench, coord
    assert not any((installed / name).exists() for name in _FORBIDDEN_TOP_LEVEL)
    assert (installed / "cellar" / "coord" / "__init__.py").is_file()  # the original defect


def test_the_installed_entry_point_runs(installed: Path, tmp_path: Path) -> None:
    out = _run(installed, [str(installed / "bin" / "cellar"), "--help"], tmp_path, 60)
    assert "up" in out and "master" in out


def test_put_get_against_a_cluster_started_from_the_install(installed: Path,
                                                            tmp_path: Path) -> None:
    out = _run(installed, ["-c", _ROUNDTRIP], tmp_path, 120)
    assert "roundtrip ok" in out
    assert str(installed.resolve()) in out
