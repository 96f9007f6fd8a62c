"""Engine virtualenvs for the engine tests: built once per recipe, outside the clone, reused.

Why it exists
    The engine tests (tests/engines/) run Cellar's adapters inside the engines' own code, which
    needs SGLang or LMCache and torch: 1.5-2.5 GB that must not land in the project's `.venv`
    and should not be rebuilt by every `make test`. So each engine has a recipe folder
    (`tests/engines/recipes/<engine>/`: `steps.txt`, one `pip install` per line, all run with
    `constraints.txt`; `stubs/`, small modules copied into site-packages) and the venv lives in
    `$CELLAR_ENGINE_CACHE` (default `~/.cache/cellar/engines`) as `<engine>-<sha>`, where the
    sha covers the recipe, the build procedure's version, Cellar's runtime dependencies and the Python version.
    A changed recipe builds a new folder; an unchanged one is reused as is.

    Cellar itself is not installed into the shared venv (several clones use one venv): `site`
    builds `$CELLAR_ENGINE_CACHE/sites/<sha of the clone's path>/`, a folder of symlinks that
    maps `cellar.<part>` to the clone's top-level folders as pyproject's package-dir does, and
    the tests run with it on PYTHONPATH, so they always see the clone's current code. It lives
    outside the clone, so nothing under the clone holds a second way to reach its code.

Commands (python3 tests/engines/engine_venv.py ...)
    build <engine>               build if needed; print the venv's folder
    python <engine>              print the venv's python (building if needed)
    site                         (re)build this clone's site folder; print it
    run <engine> -- <args...>    run the venv's python with that folder on PYTHONPATH

torch's CPU wheel is found through pip's configuration (here: the find-links folder holding
it); on a machine without it, set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.

Concurrency: builds take an exclusive lock on `<cache>/.lock`, write into `<name>.tmp` and
rename it when complete, so two clones building at once end with one complete venv. `site`
takes the same lock, and rebuilds a clone's folder only when it no longer matches the clone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
RECIPES = Path(__file__).resolve().parent / "recipes"
# Bounded: one pip step that hangs (a dead index) must not eat the 15-minute test budget.
PIP_STEP_TIMEOUT_S = 900
COMPLETE_MARK = ".cellar-complete"
BUILD_LOG = "cellar-build.log"
# Part of every venv's key: bump it when `build` changes what it produces (edits that do not
# change the venv, like these comments, must not rebuild 2.5 GB).
BUILD_PROCEDURE = 1


def cache_root() -> Path:
    env = os.environ.get("CELLAR_ENGINE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cellar" / "engines"


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def runtime_deps() -> list[str]:
    """Cellar's own runtime dependencies (pyproject) plus what the test runner needs."""
    deps = list(_pyproject()["project"]["dependencies"])
    return deps + ["pytest>=8", "pytest-timeout>=2.3"]


def recipe_sha(engine: str) -> str:
    folder = RECIPES / engine
    if not (folder / "steps.txt").is_file():
        raise SystemExit(f"no recipe for engine {engine!r} in {RECIPES}")
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(f"procedure {BUILD_PROCEDURE}".encode())
    h.update("\n".join(runtime_deps()).encode())
    h.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return h.hexdigest()[:12]


def venv_dir(engine: str) -> Path:
    return cache_root() / f"{engine}-{recipe_sha(engine)}"


def _steps(engine: str) -> list[list[str]]:
    lines = (RECIPES / engine / "steps.txt").read_text().splitlines()
    return [line.split() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _site_packages(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return site


def _log(message: str) -> None:
    print(f"[engine-venv] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _cache_locked() -> Iterator[None]:
    """The engine cache's exclusive lock (`<cache>/.lock`), held by builds and by `site`."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(engine: str) -> Path:
    target = venv_dir(engine)
    if (target / COMPLETE_MARK).is_file():
        return target
    with _cache_locked():
        if (target / COMPLETE_MARK).is_file():  # another clone built it while we waited
            return target
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        started = time.monotonic()
        _log(f"building {target} (recipe {RECIPES / engine})")
        subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True)
        py = str(tmp / "bin" / "python")
        constraints = str(RECIPES / engine / "constraints.txt")
        pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", constraints]
        with open(tmp / BUILD_LOG, "w") as out:
            for step in _steps(engine) + [runtime_deps()]:
                _log("pip install " + " ".join(step))
                out.write("$ pip install " + " ".join(step) + "\n")
                out.flush()
                done = subprocess.run(pip + step, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=PIP_STEP_TIMEOUT_S)
                if done.returncode != 0:
                    raise SystemExit(f"pip failed (exit {done.returncode}); see {tmp / BUILD_LOG}")
        stubs = RECIPES / engine / "stubs"
        if stubs.is_dir():
            shutil.copytree(stubs, _site_packages(tmp), dirs_exist_ok=True)
        seconds = time.monotonic() - started
        (tmp / COMPLETE_MARK).write_text(f"built in {seconds:.0f} s\n")
        shutil.rmtree(target, ignore_errors=True)
        # A venv's scripts name their folder; the rename keeps `bin/python` (a symlink) valid
        # and the tests only ever call `bin/python -m ...`.
        tmp.rename(target)
        _log(f"built in {seconds:.0f} s")
    return target


SITECUSTOMIZE = "import cellar  # noqa: F401  (see engine_venv.site)\n"


def _site_links() -> dict[str, Path]:
    """What this clone's site folder holds: each link's path inside it -> the clone's folder."""
    mapping: dict[str, str] = _pyproject()["tool"]["setuptools"]["package-dir"]
    links = {f"cellar/{entry.name}": entry
             for entry in (ROOT / mapping.get("cellar", "cellar")).iterdir()
             if entry.name != "__pycache__"}
    for name, folder in mapping.items():
        if name == "cellar" or not (ROOT / folder).is_dir():
            continue
        parts = name.split(".")
        assert parts[0] == "cellar" and len(parts) == 2, f"unexpected package-dir entry {name}"
        links.setdefault(f"cellar/{parts[1]}", ROOT / folder)
    return links


def _site_current(out: Path, links: dict[str, Path]) -> bool:
    pkg = out / "cellar"
    custom = out / "sitecustomize.py"
    if not pkg.is_dir() or not custom.is_file() or custom.read_text() != SITECUSTOMIZE:
        return False
    held = {f"cellar/{entry.name}": entry for entry in pkg.iterdir()}
    return held.keys() == links.keys() and all(
        entry.is_symlink() and Path(os.readlink(entry)) == links[name]
        for name, entry in held.items())


def site() -> Path:
    """This clone's site folder (outside it, in the engine cache): `cellar` and its parts as
    symlinks into the clone. Rebuilt only when the clone's folders changed, under the cache's
    lock: the engine suites run at once (`make -j2 test-engines`), and a folder rebuilt under
    a running suite would take its imports away."""
    links = _site_links()
    clone = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    out = cache_root() / "sites" / clone
    out.parent.mkdir(parents=True, exist_ok=True)
    with _cache_locked():
        if _site_current(out, links):
            return out
        tmp = out.with_name(f"{clone}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for name, target in links.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).symlink_to(target)
        # pytest puts the clone's root first on sys.path (pyproject's pythonpath), where
        # `cellar/` is only the package root; importing `cellar` here first, at interpreter
        # start, binds it to this folder so `cellar.client` & co. resolve through the links.
        (tmp / "sitecustomize.py").write_text(SITECUSTOMIZE)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "build" and len(rest) == 1:
        print(build(rest[0]))
    elif command == "python" and len(rest) == 1:
        print(build(rest[0]) / "bin" / "python")
    elif command == "site" and not rest:
        print(site())
    elif command == "run" and len(rest) >= 2 and rest[1] == "--":
        py = build(rest[0]) / "bin" / "python"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(site()), str(ROOT)]
                                            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        os.chdir(ROOT)
        os.execve(str(py), [str(py), *rest[2:]], env)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
