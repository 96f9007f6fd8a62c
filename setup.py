"""Package discovery for the one distribution `cellar-kv` (everything else is in pyproject.toml).

Each part of Cellar keeps its own top-level folder (`master/`, `client/`, ...) and installs as a
subpackage of `cellar` (`cellar.master`, `cellar.client`, ...), mapped in pyproject.toml's
`[tool.setuptools.package-dir]`. Setuptools' own discovery cannot follow such a mapping, and a
hand-written package list once left `cellar.coord` out of the wheel, so this file derives the
list: every mapped folder that exists and holds an `__init__.py`, plus every package below it.
A room that is mapped but not present (yet) is skipped. Nothing outside the mapped folders is
packaged, so no top-level `master`, `client` or `proto` can land in site-packages.
"""

from __future__ import annotations

from pathlib import Path

import tomllib
from setuptools import Extension, find_packages, setup

ROOT = Path(__file__).resolve().parent


def mapped_packages(root: Path = ROOT) -> tuple[list[str], dict[str, str]]:
    """(every package name, the package-dir mapping of the folders present) under `root`."""
    with open(root / "pyproject.toml", "rb") as f:
        mapping: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    packages: list[str] = []
    present: dict[str, str] = {}
    for name, folder in mapping.items():
        if not (root / folder / "__init__.py").is_file():
            continue
        present[name] = folder
        packages.append(name)
        packages += [f"{name}.{sub}" for sub in find_packages(str(root / folder))]
    return sorted(packages), present


# Native helpers, each optional: without a C compiler the install still succeeds and the code
# that uses them falls back to pure Python (slower, same results).
EXTENSIONS = [Extension("cellar.transfer._copyv", ["transfer/_copyv.c"], optional=True),
              Extension("cellar.transfer._spin", ["transfer/_spin.c"], optional=True),
              Extension("cellar.transfer._replies", ["transfer/_replies.c"], optional=True)]

if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    _packages, _package_dir = mapped_packages()
    setup(packages=_packages, package_dir=_package_dir, ext_modules=EXTENSIONS)
