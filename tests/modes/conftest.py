"""The example matrix (``nox -s modes``) is long: it runs only when ``GUIDE_MODES=1`` says so.

Without it, its tests are deselected at collection (as the site tests are; see tests/no_skips.py),
so ``nox -s tests`` stays fast and never passes by skipping. At the end of a matrix run the terminal
summary prints one row per run: example, world size, way, outcome and seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent
#: (example, N or "python", outcome, seconds), filled by the matrix tests.
RESULTS: list[tuple[str, str, str, float]] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("GUIDE_MODES") == "1":
        return
    dropped = [item for item in items if Path(str(item.fspath)).parent == HERE]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


def pytest_terminal_summary(terminalreporter) -> None:
    if not RESULTS:
        return
    terminalreporter.section("example matrix (example, ranks, way, outcome, seconds)")
    for example, n, outcome, seconds in sorted(RESULTS):
        terminalreporter.write_line(f"{example:32} {n:>8} {outcome:8} {seconds:7.1f} s")
