"""The compat room's import rule (compat/__init__.py), checked statically and at run time:
compat imports only the SDK (so neither the master nor the storage node: the embedded node is
a child process), no `mooncake` module is shipped or imported, and nothing else in Cellar
imports compat."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("master", "storage_node", "mooncake")
SDK = ("cellar", "cellar.errors")  # plus cellar.client and below, and compat's own modules
ROOMS = ("cellar", "coord", "master", "storage_node", "client", "transfer", "proto", "bench",
         "integrations", "devtools")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _is_under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_compat_imports_neither_master_nor_storage_node_nor_mooncake():
    files = sorted((ROOT / "compat").rglob("*.py"))
    assert len(files) >= 8
    bad = [(f.name, name) for f in files for name in _imports(f)
           if any(_is_under(name, p) for p in FORBIDDEN)]
    assert bad == []


def _sdk_or_own(name: str) -> bool:
    return name in SDK or _is_under(name, "cellar.client") or _is_under(name, "cellar.compat")


def test_compat_imports_only_the_sdk():
    files = sorted((ROOT / "compat").rglob("*.py"))
    bad = [(f.name, name) for f in files for name in _imports(f)
           if _is_under(name, "cellar") and not _sdk_or_own(name)]
    assert bad == []
    doc = ast.get_docstring(ast.parse((ROOT / "compat" / "__init__.py").read_text())) or ""
    assert "Import rule: may import only cellar, cellar.errors, cellar.client.*" in doc


def test_nothing_else_imports_compat():
    bad = []
    for room in ROOMS:
        for path in (ROOT / room).rglob("*.py") if (ROOT / room).is_dir() else []:
            bad += [(str(path.relative_to(ROOT)), n) for n in _imports(path)
                    if _is_under(n, "cellar.compat") or _is_under(n, "compat")]
    assert bad == []


def test_no_mooncake_module_is_shipped():
    assert not (ROOT / "mooncake").exists() and not (ROOT / "mooncake.py").exists()
    # compat/mooncake/ is the package cellar.compat.mooncake (it cannot shadow a real `mooncake`);
    # the opt-in shim is written on request, never shipped.
    assert (ROOT / "compat" / "mooncake" / "__init__.py").is_file()
    assert not any((ROOT / room / "mooncake").exists() or (ROOT / room / "mooncake.py").exists()
                   for room in ROOMS)


def test_importing_compat_loads_no_server_code():
    code = ("import sys, cellar.compat.mooncake; "
            "print(sorted(m for m in sys.modules if m.startswith(('cellar.master', "
            "'cellar.storage_node')) or m == 'mooncake' or m.startswith('mooncake.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"
