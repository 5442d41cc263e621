"""pytest plugin: a session never passes by skipping.

A test that is not meant for this run is *deselected* when the run is collected, and the summary
says which and why: the built-site tests unless ``GUIDE_SITE_TESTS`` names their group (the
``browser`` and ``downloads`` nox sessions do), and the CUDA tests on a machine without a GPU. A test
that is selected and then skips (``pytest.skip``, ``importorskip``, a ``skipif`` that nobody
deselected) fails the run, naming the test and its reason: a missing browser, package or site is a
broken check, not a pass. ``GUIDE_ALLOW_SKIPS=1`` lets skips pass (for a local, partial run).
"""

from __future__ import annotations

import os

import pytest

#: Test-name prefix -> the GUIDE_SITE_TESTS group that runs it.
SITE_GROUPS = {"test_browser_": "browser", "test_download_": "downloads"}


def site_groups_enabled() -> set[str]:
    return {s.strip() for s in os.environ.get("GUIDE_SITE_TESTS", "").split(",") if s.strip()}


def _why_not_here(item: pytest.Item, enabled: set[str], has_cuda: bool) -> str | None:
    for prefix, group in SITE_GROUPS.items():
        if item.name.startswith(prefix) and group not in enabled:
            return f"{group} tests (need the built site: nox -s docs, then nox -s {group})"
    if item.get_closest_marker("cuda") and not has_cuda:
        return "CUDA tests (no GPU on this machine)"
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device; deselected without one")
    config.stash[_DESELECTED] = {}


_DESELECTED = pytest.StashKey[dict]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    enabled = site_groups_enabled()
    has_cuda = False
    if any(item.get_closest_marker("cuda") for item in items):
        import torch
        has_cuda = torch.cuda.is_available()
    keep, dropped = [], []
    for item in items:
        why = _why_not_here(item, enabled, has_cuda)
        if why is None:
            keep.append(item)
        else:
            dropped.append(item)
            config.stash[_DESELECTED][why] = config.stash[_DESELECTED].get(why, 0) + 1
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


#: "nodeid: reason" of every test that skipped in this run (the hook gets no config to stash it on).
_pending: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _pending.append(f"{report.nodeid}: {reason}")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """Under pytest-xdist the workers collect and deselect; each sends its counts (the same in every
    worker: each collects every test) to the controller, which prints the summary."""
    node.config.stash[_DESELECTED].update(getattr(node, "workeroutput", {}).get(_WORKER_KEY, {}))


_WORKER_KEY = "guide_deselected"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    for why, count in config.stash[_DESELECTED].items():
        terminalreporter.write_line(f"deselected {count} {why}")
    if _pending and os.environ.get("GUIDE_ALLOW_SKIPS") != "1":
        terminalreporter.write_line(
            f"{len(_pending)} test(s) skipped: a skip is a failure here (GUIDE_ALLOW_SKIPS=1 allows "
            "it for a local run):", red=True)
        for line in _pending:
            terminalreporter.write_line(f"  {line}", red=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: report to the controller
        session.config.workeroutput[_WORKER_KEY] = dict(session.config.stash[_DESELECTED])
    if _pending and os.environ.get("GUIDE_ALLOW_SKIPS") != "1" and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
