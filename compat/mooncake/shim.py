"""The opt-in `mooncake.store` shim, for code that imports Mooncake and cannot be edited.

    python -m cellar.compat.mooncake.shim ~/.cellar/mooncake-shim
    PYTHONPATH=~/.cellar/mooncake-shim python serve.py     # `from mooncake.store import ...`

What it owns
    `write_shim(folder)`, which writes `folder/mooncake/__init__.py` and
    `folder/mooncake/store.py`; the latter re-exports `MooncakeDistributedStore` and
    `ReplicateConfig` from `cellar.compat.mooncake`. Only a process that puts `folder` on its
    `sys.path` sees it.

Why not shipped as a package
    An installed top-level `mooncake` would shadow a real Mooncake install for every program
    on the machine; the shim must be something a user chooses, per process.

What it must never do
    Write outside `folder`, or overwrite a `mooncake` package it did not write.
"""

from __future__ import annotations

import sys
from pathlib import Path

MARK = "# written by cellar.compat.mooncake.shim"
_STORE = f'''{MARK}
"""Mooncake's import path, Cellar's store (opt-in shim; see cellar.compat.mooncake.shim)."""
from cellar.compat.mooncake import (ErrorCode, MooncakeDistributedStore, ReplicateConfig,
                                    SoftPinAction)

__all__ = ["ErrorCode", "MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction"]
'''
_INIT = f'{MARK}\n"""Opt-in shim package: `mooncake.store` is served by Cellar."""\n'


def write_shim(folder: str | Path) -> Path:
    """Write the shim package into `folder` (created if needed); returns `folder`."""
    root = Path(folder).expanduser()
    package = root / "mooncake"
    for existing in (package / "__init__.py", package / "store.py"):
        if existing.exists() and MARK not in existing.read_text(errors="replace"):
            raise FileExistsError(f"{existing} exists and was not written by this shim")
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(_INIT)
    (package / "store.py").write_text(_STORE)
    return root


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m cellar.compat.mooncake.shim FOLDER", file=sys.stderr)
        return 2
    root = write_shim(args[0])
    print(f"wrote {root / 'mooncake'}; run with PYTHONPATH={root} to use it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
