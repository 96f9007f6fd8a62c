"""Suite-wide hooks: after a run, say which SDK face x transport combinations ran.

The faces suites (`tests/support/faces.py`) run one body over both faces and both transports; a
combination that silently stopped running would otherwise go unseen, so the count is printed.
"""

from __future__ import annotations

from typing import Any

from tests.support import faces


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = faces.opened_summary()
    if lines:
        terminalreporter.section("face x transport")
        for line in lines:
            terminalreporter.write_line(line)
