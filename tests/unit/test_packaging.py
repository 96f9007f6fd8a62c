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


def _setup_module():
    spec = importlib.util.spec_from_file_location("cellar_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() does not run
    return module


def test_discovery_packages_every_subpackage_of_every_mapped_room_present(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"cellar" = "cellar"\n'
        '"cellar.integrations" = "integrations"\n"cellar.compat" = "compat"\n')
    for package in ("cellar", "cellar/coord", "cellar/coord/deep", "integrations",
                    "integrations/sglang"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "cellar" / "notapackage").mkdir()  # no __init__.py: not a package
    packages, package_dir = _setup_module().mapped_packages(tmp_path)
    assert packages == ["cellar", "cellar.coord", "cellar.coord.deep", "cellar.integrations",
                        "cellar.integrations.sglang"]
    assert package_dir == {"cellar": "cellar", "cellar.integrations": "integrations"}


def test_discovery_over_this_repository_finds_coord_and_every_room():
    packages, package_dir = _setup_module().mapped_packages(ROOT)
    assert "cellar.coord" in packages
    for room in ("cellar.master", "cellar.storage_node", "cellar.client", "cellar.transfer",
                 "cellar.proto", "cellar.bench"):
        assert room in packages and room in package_dir
    assert all(p == "cellar" or p.startswith("cellar.") for p in packages)
