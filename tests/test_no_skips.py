"""The no-skips plugin: a skipped test fails the run; what is not for this run is deselected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SUITE = '''
import pytest

def test_runs():
    pass

def test_browser_page_loads():
    pass

@pytest.mark.cuda
def test_on_a_gpu():
    pass
'''


def inner_pytest(tmp_path: Path, body: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(SUITE + body)
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("GUIDE_SITE_TESTS", "GUIDE_ALLOW_SKIPS")}
    full_env.update(env, PYTHONPATH=str(TESTS), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no_skips", "-p", "no:cacheprovider",
                           "-q", *args, str(tmp_path)], cwd=tmp_path, env=full_env, capture_output=True,
                          text=True, timeout=120)


def test_a_skipped_test_fails_the_run_naming_it(tmp_path: Path) -> None:
    run = inner_pytest(tmp_path, "\ndef test_needs_a_tool():\n    pytest.skip('no chromium')\n")
    assert run.returncode == 1, run.stdout
    assert "test_inner.py::test_needs_a_tool" in run.stdout and "no chromium" in run.stdout


def test_importorskip_fails_the_run_too(tmp_path: Path) -> None:
    run = inner_pytest(tmp_path, "\ndef test_x():\n    pytest.importorskip('no_such_package_x')\n")
    assert run.returncode == 1, run.stdout


def test_skips_pass_when_allowed_for_a_local_run(tmp_path: Path) -> None:
    run = inner_pytest(tmp_path, "\ndef test_x():\n    pytest.skip('later')\n", GUIDE_ALLOW_SKIPS="1")
    assert run.returncode == 0, run.stdout


def test_site_and_cuda_tests_are_deselected_with_a_reason(tmp_path: Path) -> None:
    run = inner_pytest(tmp_path, "")
    assert run.returncode == 0, run.stdout
    assert "1 passed, 2 deselected" in run.stdout
    assert "deselected 1 browser tests" in run.stdout
    assert "deselected 1 CUDA tests (no GPU on this machine)" in run.stdout


def test_an_enabled_site_group_is_collected(tmp_path: Path) -> None:
    run = inner_pytest(tmp_path, "", GUIDE_SITE_TESTS="browser")
    assert "2 passed, 1 deselected" in run.stdout, run.stdout


# nox -s tests runs the suite on pytest-xdist workers (noxfile._workers): the workers collect,
# deselect and run; the controller must still fail the run on a skip and print the reasons.
def test_under_xdist_a_skip_still_fails_the_run_naming_it(tmp_path: Path) -> None:
    run = inner_pytest(tmp_path, "\ndef test_needs_a_tool():\n    pytest.skip('no chromium')\n",
                       "-n", "2")
    assert run.returncode == 1, run.stdout
    assert "test_inner.py::test_needs_a_tool" in run.stdout and "no chromium" in run.stdout


def test_under_xdist_the_deselected_tests_are_counted_once_with_their_reason(tmp_path: Path) -> None:
    run = inner_pytest(tmp_path, "", "-n", "2")
    assert run.returncode == 0, run.stdout
    assert "deselected 1 browser tests" in run.stdout, run.stdout
    assert "deselected 1 CUDA tests (no GPU on this machine)" in run.stdout, run.stdout
