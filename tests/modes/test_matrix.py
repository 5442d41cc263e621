"""Every example at every world size it declares, the ways a user starts it (issue 25).

For each example and each N among 1, 2, 4 and 8 that its ``guide.world_size(...)`` declaration
supports: ``torchrun --standalone --nproc-per-node=N example.py``; and once ``python example.py``
(the page's own sizes). Each run must exit 0 and print its "All checks passed" line exactly once
(under torchrun only rank 0 speaks). The notebook of the main example runs in a Jupyter kernel in
tests/test_example_modes.py, which ``nox -s modes`` runs too. Sizes that an example does not
support are tested, fast, in tests/test_world_sizes.py.

Select parts with ``-k``: ids are ``plot_x-torchrun-n4`` and ``plot_x-python``, e.g.
``nox -s modes -- -k "n2 or n4"``. On 2 shared cores (the closing note of issue 25 gives the
measured matrix) most runs take 20-120 s at 2 and 4 ranks; at 8, each rank gets a quarter core.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES

from guide.world_sizes import declared

from .conftest import RESULTS

MATRIX_SIZES = (1, 2, 4, 8)
PASSED = "All checks passed"
EXAMPLE_FILES = sorted(EXAMPLES.glob("plot_*.py"))
TORCHRUN = [(p, n) for p in EXAMPLE_FILES for n in declared(p).supports if n in MATRIX_SIZES]


def _run(command: list[str], cwd: Path, timeout: float) -> tuple[int, str, float]:
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "GUIDE_PROGRESS": "0"}
    start = time.monotonic()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def _check(name: str, n: str, rc: int, out: str, seconds: float) -> None:
    ok = rc == 0 and out.count(PASSED) == 1
    RESULTS.append((name, n, "pass" if ok else "FAIL", seconds))
    assert rc == 0, out[-6000:]
    assert out.count(PASSED) == 1, f"'{PASSED}' printed {out.count(PASSED)} times:\n{out[-6000:]}"


@pytest.mark.timeout(1800)  # 8 ranks on 2 cores: each rank a quarter of a core
@pytest.mark.parametrize("path, n", TORCHRUN, ids=[f"{p.stem}-torchrun-n{n}" for p, n in TORCHRUN])
def test_example_under_torchrun(path: Path, n: int, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={n}", str(path)]
    _check(path.stem, f"torchrun {n}", *_run(command, tmp_path, 1700))


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[f"{p.stem}-python" for p in EXAMPLE_FILES])
def test_example_with_python(path: Path, tmp_path: Path) -> None:
    _check(path.stem, "python", *_run([sys.executable, str(path)], tmp_path, 1100))
