"""`cellar up` end to end: start it, use it from other processes, stop it with SIGTERM.

Also the CLI against the same cluster: `cellar status` shows the nodes; `cellar put/get/rm`
round-trip a file; errors are one line and a non-zero exit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from cellar.devtools.ports import free_port
from tests.integration.proc_tools import alive, children_of, read_lines_until

CELLAR = [sys.executable, "-m", "cellar"]
READY = re.compile(r"^Cellar is up: master (\S+),")
ONE_LINER = "import cellar; c = cellar.connect({addr!r}); c.put('k', b'v'); print(c.get('k'))"


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, capture_output=True, timeout=60, **kwargs)


@pytest.fixture
def cellar_up(tmp_path):
    proc = subprocess.Popen(
        [*CELLAR, "up", "--nodes", "2", "--segment-size", "32MiB", "--port", "0",
         "--http-port", "0", "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        lines = read_lines_until(proc.stdout, READY.match)
        ready = READY.match(lines[-1]) if lines else None
        address = ready.group(1) if ready else None
        assert address, "cellar up never said it was up:\n" + "\n".join(lines)
        yield proc, address, lines
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.timeout(120)
def test_cellar_up_one_liner_status_and_sigterm(cellar_up, tmp_path):
    proc, address, lines = cellar_up
    banner = "\n".join(lines)
    kids = children_of(proc.pid)
    assert len(kids) == 3, f"expected a master and 2 nodes under cellar up, got {kids}"

    # the quick-start one-liner, from another process
    out = run([sys.executable, "-c", ONE_LINER.format(addr=address)])
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == "b'v'"

    # cellar status shows both nodes as tables
    out = run([*CELLAR, "status", "--master", address])
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode()
    assert "node-0" in text and "node-1" in text and "ACTIVE" in text
    assert "NODE" in text and "TENANT" in text and "HELD" in text and "default" in text

    # cellar put / get / rm round trip through files and stdin/stdout
    src = tmp_path / "in.bin"
    src.write_bytes(os.urandom(300_000))
    env = {**os.environ, "CELLAR_MASTER": address}
    assert run([*CELLAR, "put", "file-key", str(src)], env=env).returncode == 0
    out = run([*CELLAR, "put", "file-key", str(src)], env=env)
    assert out.returncode == 1 and b"already exists" in out.stderr
    assert run([*CELLAR, "put", "stdin-key", "-", "--replicas", "2"], env=env,
               input=b"from stdin").returncode == 0
    out = run([*CELLAR, "get", "stdin-key"], env=env)
    assert out.returncode == 0 and out.stdout == b"from stdin"
    dst = tmp_path / "out.bin"
    assert run([*CELLAR, "get", "file-key", str(dst)], env=env).returncode == 0
    assert dst.read_bytes() == src.read_bytes()
    assert run([*CELLAR, "rm", "file-key"], env=env).returncode == 0
    out = run([*CELLAR, "get", "file-key"], env=env)
    assert out.returncode == 1 and out.stdout == b""
    err = out.stderr.decode().strip()
    assert err.count("\n") == 0 and "not found" in err and "Traceback" not in err
    out = run([*CELLAR, "rm", "file-key"], env=env)
    assert out.returncode == 1 and b"not found" in out.stderr

    # SIGTERM stops everything, exit 0, no child left behind
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, banner + rest
    assert "stopped" in rest
    leftover = [pid for pid in kids if alive(pid)]
    assert not leftover, f"children still running after SIGTERM: {leftover}"
    assert (tmp_path / "run" / "master.log").exists()


def test_cli_errors_are_one_line(tmp_path):
    port = free_port()  # nobody listens there
    out = run([*CELLAR, "status", "--master", f"127.0.0.1:{port}", "--timeout", "0.5s"])
    assert out.returncode == 1
    err = out.stderr.decode().strip()
    assert "Unavailable" in err and "\n" not in err and "Traceback" not in err
    out = run([*CELLAR, "put", "k", str(tmp_path / "missing"), "--master", f"127.0.0.1:{port}"])
    assert out.returncode == 1 and b"No such file" in out.stderr and b"Traceback" not in out.stderr
    out = run([*CELLAR, "up", "--nodes", "0"])
    assert out.returncode == 2
