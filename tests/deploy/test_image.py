"""deploy/Dockerfile: its structure (no Docker engine here to build it) and the wheel it installs.

The wheel is built with the very command of the Dockerfile's build stage, then checked: one
import package `cellar` with every room inside (the status page included), no stray top-level
`master`/`client`, and the `cellar` entry point the image's ENTRYPOINT runs.
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


def test_every_base_image_is_pinned_to_a_slim_python_tag() -> None:
    bases = [args.split()[0] for word, args in instructions() if word == "FROM"]
    assert bases, "no FROM"
    for base in bases:
        name, _, tag = base.partition(":")
        assert name == "python", base
        assert re.fullmatch(r"3\.\d+\.\d+-slim(-\w+)?", tag), f"{base}: pin a full version tag"


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
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignored and ".venv" in ignored and "**/secrets" in ignored


def test_build_context_holds_every_room_the_wheel_packages() -> None:
    """The build stage copies the whole context, and .dockerignore keeps every folder pyproject
    maps to a cellar package (and the packaging files) in it."""
    copies = [args for word, args in instructions() if word == "COPY" and "--from" not in args]
    assert copies == [". /src"], copies
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    folders = set(re.findall(r'=\s*"([^"]+)"', section))
    assert folders, "no package-dir mapping in pyproject.toml"
    kept = folders | {"pyproject.toml", "README.md", "setup.py"}
    assert not kept & ignored, f".dockerignore drops {kept & ignored}"


def test_the_wheel_the_image_installs_builds_and_holds_the_package(tmp_path: Path) -> None:
    run = [args for word, args in instructions() if word == "RUN" and "pip wheel" in args]
    assert len(run) == 1, "the build stage builds the wheel with one `pip wheel` line"
    argv = shlex.split(run[0])
    assert argv[:2] == ["pip", "wheel"] and argv[-1] == "/src"
    wheel_dir = tmp_path / "dist"
    argv = [sys.executable, "-m", *argv[:-1], str(ROOT)]
    argv[argv.index("--wheel-dir") + 1] = str(wheel_dir)
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
