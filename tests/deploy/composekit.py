"""The Docker side of tests/deploy/test_compose_cluster.py, imported as `composekit`.

What it owns: a Docker engine to talk to, the images the compose cluster needs when no image
registry is reachable, and the `docker-compose` command line of that cluster. What it keeps: it
stops what it started and nothing else (the dockerd it launched, the compose project it brought
up), on success and on failure alike.

- `Engine.find_or_start()`: the engine of $DOCKER_HOST or /var/run/docker.sock when one answers,
  else a `dockerd` started here with its own data root, exec root and socket under a temporary
  folder, `--iptables=false --ip-masq=false --bridge=none` (no firewall rules, no docker0: the
  test's traffic is loopback only).
- `base_image(engine)`: a Debian bookworm base with Python 3.11, made by `debootstrap
  --variant=minbase` (~45 s) into a tarball cached under $CELLAR_COMPOSE_CACHE (default
  ~/.cache/cellar/compose, outside the clone) and keyed by the suite and package list; the tarball
  is `docker import`ed (~3 s) into an engine that lacks it.
- `wheelhouse(into)`: Cellar's wheel, built now from this clone, beside its dependencies' wheels,
  cached and keyed by the dependency list of pyproject.toml and the Python version: what
  deploy/Dockerfile installs with `pip --no-index`.
- `build_images(...)`: the Cellar image (deploy/Dockerfile, BASE = the local base) and etcd and
  Prometheus images (tests/deploy/compose/service.Dockerfile, the programs of Debian's
  etcd-server and prometheus packages on the same base).
- `Compose`: `docker-compose -p cellar-ci -f compose.yaml -f compose.loopback.yaml -f
  compose.ci.yaml` and any further files (compose.tls.yaml) (Debian's docker-compose 1.29, or
  `docker compose` v2 where that is what exists or CELLAR_COMPOSE_CLI asks for).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deploykit import DEPLOY, ROOT

CACHE_DIR = Path(os.environ.get("CELLAR_COMPOSE_CACHE", "~/.cache/cellar/compose")).expanduser()
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = os.environ.get("CELLAR_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
IMAGE_PYTHON = (3, 11)  # bookworm's python3, and python:3.11-slim's: the wheels must match it
CI_FILES = Path(__file__).resolve().parent / "compose"
COMPOSE_FILES = (DEPLOY / "compose" / "compose.yaml", DEPLOY / "compose" / "compose.loopback.yaml",
                 CI_FILES / "compose.ci.yaml")
PROJECT = "cellar-ci"
# what the etcd and Prometheus images carry of the Debian packages (for each, the package and its
# files: the program, and Prometheus's web UI, which Debian serves from /usr/share)
SERVICE_FILES = {"etcd": ("etcd-server", ("/usr/bin/etcd",)),
                 "prometheus": ("prometheus", ("/usr/bin/prometheus", "/usr/share/prometheus/web"))}
ENGINE_START_TIMEOUT_S = 60.0
ENGINE_STOP_TIMEOUT_S = 30.0
DEBOOTSTRAP_TIMEOUT_S = 900.0
BUILD_TIMEOUT_S = 600.0


class ComposeError(Exception):
    """A Docker, compose or image-making step failed; the message says which and why."""


def run(argv: list[str], *, env: dict[str, str] | None = None, timeout_s: float = 120.0,
        check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s,
                              cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise ComposeError(f"`{shlex.join(argv)}` did not finish in {timeout_s:.0f} s") from exc
    except FileNotFoundError as exc:
        raise ComposeError(f"`{argv[0]}` is not installed ({exc})") from exc
    if check and proc.returncode != 0:
        raise ComposeError(f"`{shlex.join(argv)}` exited {proc.returncode}:\n"
                           f"{proc.stderr[-3000:]}{proc.stdout[-1500:]}")
    return proc


def _sha(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


class Engine:
    """A Docker engine: `host` is its DOCKER_HOST; `process` the dockerd started here, if any."""

    def __init__(self, host: str, process: subprocess.Popen[bytes] | None = None,
                 folder: Path | None = None) -> None:
        self.host = host
        self.process = process
        self.folder = folder

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def docker(self, *args: str, timeout_s: float = 120.0, check: bool = True) -> str:
        return run(["docker", *args], env=self.env, timeout_s=timeout_s, check=check).stdout.strip()

    def answers(self) -> bool:
        return run(["docker", "version", "--format", "{{.Server.Version}}"], env=self.env,
                   timeout_s=20, check=False).returncode == 0

    def has_image(self, tag: str) -> bool:
        return run(["docker", "image", "inspect", tag], env=self.env, timeout_s=30,
                   check=False).returncode == 0

    @classmethod
    def find_or_start(cls) -> Engine:
        for host in (os.environ.get("DOCKER_HOST", ""), "unix:///var/run/docker.sock"):
            if host and (not host.startswith("unix://") or Path(host[7:]).exists()):
                engine = cls(host)
                if engine.answers():
                    return engine
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise ComposeError("no Docker engine answers and dockerd is not installed "
                               "(apt-get install docker.io; .ci/run does)")
        folder = Path(tempfile.mkdtemp(prefix="cellar-dockerd-"))
        with open(folder / "dockerd.log", "wb") as log:
            process = subprocess.Popen(
                [dockerd, "--data-root", str(folder / "root"), "--exec-root", str(folder / "exec"),
                 "--host", f"unix://{folder / 'docker.sock'}", "--pidfile", str(folder / "dockerd.pid"),
                 "--iptables=false", "--ip-masq=false", "--bridge=none",
                 "--storage-driver=overlay2"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        engine = cls(f"unix://{folder / 'docker.sock'}", process, folder)
        deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
        while not engine.answers():
            if process.poll() is not None or time.monotonic() > deadline:
                tail = engine.log_tail()
                engine.stop()
                raise ComposeError(f"dockerd did not come up (exit {process.returncode}):\n{tail}")
            time.sleep(0.3)
        return engine

    def log_tail(self, chars: int = 3000) -> str:
        if self.folder is None:
            return ""
        return (self.folder / "dockerd.log").read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        """Stop the dockerd started here (its containerd goes with it) and delete its folder;
        an engine found running is left alone."""
        if self.process is None or self.folder is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(ENGINE_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        # a mount dockerd left behind (killed mid-way) is detached before the folder goes
        with open("/proc/self/mounts") as mounts:
            left = [line.split()[1] for line in mounts if line.split()[1].startswith(str(self.folder))]
        for target in sorted(left, reverse=True):
            run(["umount", "-l", target], check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


def base_image(engine: Engine) -> str:
    """The tag of the local Debian base in `engine`, imported from the cached tarball (made by
    debootstrap first when the cache lacks it)."""
    key = _sha(DEBIAN_SUITE, "minbase", *BASE_PACKAGES)
    tag = f"cellar-ci-base:{key}"
    if engine.has_image(tag):
        return tag
    tarball = CACHE_DIR / f"base-{key}.tar"
    if not tarball.exists():
        _debootstrap(tarball)
    engine.docker("import", str(tarball), tag, timeout_s=300)
    return tag


def _debootstrap(tarball: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise ComposeError("debootstrap is not installed (apt-get install debootstrap; .ci/run does)")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=tarball.parent))
    try:
        run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
             DEBIAN_SUITE, str(root), DEBIAN_MIRROR], timeout_s=DEBOOTSTRAP_TIMEOUT_S)
        run(["rm", "-rf", str(root / "var/cache/apt/archives"), str(root / "var/lib/apt/lists")])
        partial = tarball.with_suffix(".partial")
        run(["tar", "-C", str(root), "-cf", str(partial), "."], timeout_s=300)
        partial.rename(tarball)  # complete or absent: a broken run leaves no tarball behind
    finally:
        run(["rm", "-rf", "--one-file-system", str(root)], check=False, timeout_s=300)


def wheelhouse(into: Path) -> None:
    """`into`: Cellar's wheel built from this clone now, and hard links to its dependencies'
    wheels (cached, keyed by pyproject's dependency list and this Python)."""
    if sys.version_info[:2] != IMAGE_PYTHON:
        raise ComposeError(f"the image's Python is {IMAGE_PYTHON[0]}.{IMAGE_PYTHON[1]}; this is "
                           f"{sys.version_info[0]}.{sys.version_info[1]}, whose wheels would not fit it")
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.M | re.S)
    if declared is None:
        raise ComposeError("pyproject.toml declares no `dependencies = [...]` list")
    deps = CACHE_DIR / f"wheels-{_sha(declared.group(1), sys.implementation.cache_tag)}"
    if not deps.exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix="wheels-", dir=CACHE_DIR))
        _pip_wheel(partial, ROOT)
        for own in partial.glob("cellar_kv-*.whl"):
            own.unlink()
        partial.rename(deps)
    into.mkdir(parents=True)
    for wheel in deps.glob("*.whl"):
        if wheel.stat().st_dev == into.stat().st_dev:
            os.link(wheel, into / wheel.name)
        else:
            shutil.copy2(wheel, into / wheel.name)
    _pip_wheel(into, ROOT, "--no-deps")


def _pip_wheel(into: Path, source: Path, *flags: str) -> None:
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", *flags,
         "--wheel-dir", str(into), str(source)], timeout_s=BUILD_TIMEOUT_S)


def build_images(engine: Engine, base: str, work: Path, tag: str) -> dict[str, str]:
    """{service kind: image}: cellar:<tag>, and etcd and Prometheus on the local base."""
    images = {"cellar": f"cellar:{tag}"}
    context = work / "cellar-context"
    wheelhouse(context / "wheelhouse")
    shutil.copy2(ROOT / ".dockerignore", context / ".dockerignore")
    engine.docker("build", "--quiet", "-f", str(DEPLOY / "Dockerfile"), "--build-arg",
                  f"BASE={base}", "-t", images["cellar"], str(context), timeout_s=BUILD_TIMEOUT_S)
    for name, (package, paths) in SERVICE_FILES.items():
        context = work / f"{name}-context"
        for path in map(Path, paths):
            if not path.exists():
                raise ComposeError(f"{path} is missing (apt-get install {package}; .ci/run does)")
            copy = context / "root" / path.relative_to("/")
            copy.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                shutil.copytree(path, copy)
            else:
                shutil.copy2(path, copy)
        images[name] = f"cellar-ci-{name}:{tag}"
        engine.docker("build", "--quiet", "-f", str(CI_FILES / "service.Dockerfile"),
                      "--build-arg", f"BASE={base}", "-t", images[name], str(context),
                      timeout_s=BUILD_TIMEOUT_S)
    return images


def compose_cli() -> list[str]:
    """Debian's docker-compose 1.29 where installed, else the `docker compose` plugin (v2);
    CELLAR_COMPOSE_CLI ("docker-compose" or "docker compose") chooses explicitly."""
    chosen = os.environ.get("CELLAR_COMPOSE_CLI", "")
    if chosen:
        return chosen.split()
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if run(["docker", "compose", "version"], check=False).returncode == 0:
        return ["docker", "compose"]
    raise ComposeError("neither docker-compose nor `docker compose` is installed "
                       "(apt-get install docker-compose; .ci/run does)")


class Compose:
    """The cluster's compose command line; `down()` removes its containers, volumes and network."""

    def __init__(self, engine: Engine, variables: dict[str, str],
                 extra_files: tuple[Path, ...] = ()) -> None:
        self.engine = engine
        self.variables = dict(variables)
        self.env = {**engine.env, **variables}
        self.argv = [*compose_cli(), "-p", PROJECT]
        for path in (*COMPOSE_FILES, *extra_files):  # extra_files: e.g. compose.tls.yaml, last
            self.argv += ["-f", str(path)]

    def __call__(self, *args: str, timeout_s: float = 300.0) -> str:
        return run([*self.argv, *args], env=self.env, timeout_s=timeout_s).stdout.strip()

    def container(self, service: str) -> str:
        ids = self("ps", "-q", service, timeout_s=60).split()
        if len(ids) != 1:
            raise ComposeError(f"service {service}: expected one container, found {ids}")
        return ids[0]

    def logs(self) -> str:
        return run([*self.argv, "logs", "--no-color", "--tail", "40"], env=self.env, timeout_s=60,
                   check=False).stdout

    def down(self) -> None:
        run([*self.argv, "down", "--volumes", "--remove-orphans", "--timeout", "5"], env=self.env,
            timeout_s=180, check=False)
