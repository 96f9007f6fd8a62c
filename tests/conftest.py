"""Suite-wide hooks: after a run, say which SDK face x transport combinations ran.

The faces suites (`tests/support/faces.py`) run one body over both faces and both transports; a
combination that silently stopped running would otherwise go unseen, so the count is printed.
`make test` runs the suite in two pytest-xdist workers (`-n 2 --dist loadfile`): each worker
counts what it opened and hands the counts to the controller, which prints their sum.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import faces

_WORKER_OUTPUT_KEY = "faces_opened"


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:  # an xdist worker: the controller prints the summary
        worker_output[_WORKER_OUTPUT_KEY] = [
            [face, transport, count] for (face, transport), count in faces.OPENED.items()]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller, as each worker ends: add the worker's counts to this process's."""
    for face, transport, count in getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT_KEY, []):
        faces.OPENED[face, transport] += count


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = faces.opened_summary()
    if lines:
        terminalreporter.section("face x transport")
        for line in lines:
            terminalreporter.write_line(line)
