"""Regenerate the gRPC code for cellar.proto (``make proto``).

protoc names imports after the path it was given, so the .proto is staged as
``cellar/proto/cellar.proto`` in a scratch folder: the generated stub then says
``from cellar.proto import cellar_pb2`` and works from the installed package.
``--check`` compares instead of writing (a test runs it so stale code cannot land).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED = ("cellar_pb2.py", "cellar_pb2_grpc.py", "cellar_pb2.pyi")


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # build/dev dependency only

    with tempfile.TemporaryDirectory() as scratch:
        staged = Path(scratch) / "cellar" / "proto"
        staged.mkdir(parents=True)
        shutil.copy(HERE / "cellar.proto", staged / "cellar.proto")
        argv = [
            "protoc",
            f"-I{scratch}",
            f"--python_out={scratch}",
            f"--pyi_out={scratch}",
            f"--grpc_python_out={scratch}",
            "cellar/proto/cellar.proto",
        ]
        if protoc.main(argv) != 0:
            raise SystemExit("protoc failed")
        for name in GENERATED:
            shutil.copy(staged / name, out_dir / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    args = parser.parse_args(argv)
    if not args.check:
        generate(HERE)
        return 0
    with tempfile.TemporaryDirectory() as fresh:
        generate(Path(fresh))
        stale = [n for n in GENERATED if not filecmp.cmp(Path(fresh) / n, HERE / n, shallow=False)]
    if stale:
        print(f"stale generated code: {', '.join(stale)}; run `make proto`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
