"""Shared test plumbing: where things are, and how to run a (possibly fault-injected) example."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

# Deselect what is not for this run, and fail a run in which a selected test skips.
pytest_plugins = ("no_skips",)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MAIN_EXAMPLE = EXAMPLES / "plot_ddp_vs_fsdp2.py"


@dataclass
class Run:
    returncode: int
    output: str
    seconds: float


def run_python(script: Path, timeout: float = 240, cwd: Path | None = None) -> Run:
    """Run ``python script`` as a user would; return exit code, stdout+stderr and wall time."""
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd or script.parent, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)


def run_page(page: Path) -> dict:
    """Run ``page`` once in this process, as sphinx-gallery runs it; return its one result object
    (the page's ``RESULT``) and what it printed: ``{"RESULT": ..., "OUTPUT": ...}``, nothing else,
    so tests reach the page through what it hands them and not through its other globals."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib.pyplot as plt

    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # plt.show() on Agg
        namespace = runpy.run_path(str(page), run_name="__main__")
    plt.close("all")
    assert "RESULT" in namespace, f"{page.name} defines no RESULT for its tests"
    return {"RESULT": namespace["RESULT"], "OUTPUT": out.getvalue()}


@pytest.fixture(scope="module")
def page(request) -> dict:
    """:func:`run_page` of the test module's ``PAGE``, once per module."""
    return run_page(request.module.PAGE)


@pytest.fixture(autouse=True)
def _fresh_group_names():
    """A test that fails to start a world must not rename the next test's (tests/peers.py)."""
    yield
    from peers import reset_group_names

    reset_group_names()


@pytest.fixture
def root() -> Path:
    return ROOT
