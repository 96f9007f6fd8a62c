"""deploy/Dockerfile: its structure and the wheel it installs (test_compose_cluster.py builds
and runs the image for real, under `make test-compose`).

The wheel is built with the command of `make wheelhouse` (what the image installs from), then
checked: one import package `cellar` with every room inside (the status page included), no stray
top-level `master`/`client`, and the `cellar` entry point the image's ENTRYPOINT runs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

from deploykit import DEPLOY, ROOT

DOCKERFILE = DEPLOY / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_the_base_is_a_build_argument_defaulting_to_a_pinned_slim_python_image() -> None:
    steps = instructions()
    first_from = next(i for i, (word, _) in enumerate(steps) if word == "FROM")
    defaults = dict(args.split("=", 1) for word, args in steps[:first_from] if word == "ARG")
    name, _, tag = defaults.get("BASE", "").partition(":")
    assert name == "python", f"ARG BASE defaults to {defaults.get('BASE')!r}"
    assert re.fullmatch(r"3\.\d+\.\d+-slim(-\w+)?", tag), f"{name}:{tag}: pin a full version tag"
    bases = [args.split()[0] for word, args in steps if word == "FROM"]
    assert bases and all(base == "${BASE}" for base in bases), bases


def test_final_stage_runs_as_a_non_root_user() -> None:
    users = [args for word, args in final_stage() if word == "USER"]
    assert users, "the final stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]
    # the user is created before it is used
    run_lines = " ".join(args for word, args in final_stage() if word == "RUN")
    assert f"--uid {user}" in run_lines or "useradd" in run_lines and user in run_lines


def test_healthcheck_probes_health() -> None:
    checks = [args for word, args in final_stage() if word == "HEALTHCHECK"]
    assert len(checks) == 1
    env = " ".join(args for word, args in final_stage() if word == "ENV")
    assert "/health" in checks[0] + env
    assert "CMD" in checks[0] and "--interval=" in checks[0]


def test_entrypoint_is_cellar_and_labels_are_set() -> None:
    entry = [args for word, args in final_stage() if word == "ENTRYPOINT"]
    assert entry == ['["cellar"]']
    labels = " ".join(args for word, args in final_stage() if word == "LABEL")
    for key in ("org.opencontainers.image.title", "org.opencontainers.image.version",
                "org.opencontainers.image.licenses"):
        assert key in labels


def test_no_secret_is_baked_into_the_image() -> None:
    text = DOCKERFILE.read_text()
    assert "CELLAR_CLUSTER_SECRET" not in text and "cluster-secret" not in text.replace(
        "# Nothing secret", "")
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert ignored == ["*", "!wheelhouse"], "the build context is the wheelhouse alone"


def test_the_build_installs_from_the_wheelhouse_alone() -> None:
    """No network in the build: the context's wheelhouse is copied in and pip may not look
    anywhere else."""
    copies = [args for word, args in instructions() if word == "COPY" and "--from" not in args]
    assert copies == ["wheelhouse /wheelhouse"], copies
    installs = [args for word, args in instructions() if word == "RUN" and "pip install" in args]
    assert len(installs) == 1
    argv = shlex.split(installs[0])
    assert "--no-index" in argv and argv[argv.index("--find-links") + 1] == "/wheelhouse"
    make = (ROOT / "Makefile").read_text()
    assert "--wheel-dir wheelhouse ." in make, "`make wheelhouse` builds what the image installs"


def test_the_wheel_the_image_installs_builds_and_holds_the_package(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "dist"
    # `make wheelhouse`'s command, for this clone's wheel alone
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps",
            "--wheel-dir", str(wheel_dir), str(ROOT)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    wheels = list(wheel_dir.glob("cellar_kv-*.whl"))
    assert len(wheels) == 1
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "cellar = cellar.cli:main" in wheel.read(entry_points).decode()
    tops = {n.split("/", 1)[0] for n in names if not n.startswith("cellar_kv-")}
    assert tops == {"cellar"}, tops
    for module in ("cellar/cli.py", "cellar/master/serving/status_page.py", "cellar/master/serving/events.py",
                   "cellar/client/top.py", "cellar/storage_node/main.py", "cellar/proto/cellar_pb2.py"):
        assert module in names, module
