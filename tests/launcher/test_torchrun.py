"""Under torchrun: the job's world size must match torchrun's, and only rank 0 speaks.

The one-voice tests start a plain ``python`` with torchrun's environment variables (no process group
is formed: the script never launches a job), which is all :func:`speak_only_on_rank0` looks at. The
real thing, two torchrun "nodes" on loopback, is tested in ``tests/test_example_modes.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import guide
from guide.launcher import torchrun

from .workers import sum_of_ranks

# Per-test limit here (tighter than pyproject's): slowest measured 23 s (a subprocess that imports
# guide and torch, or a session's first job with the fork server cold; 2 loaded cores).
pytestmark = pytest.mark.timeout(60)

TORCHRUN_ENV = {"WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                "TORCHELASTIC_RUN_ID": "test"}

PAGE = textwrap.dedent("""
    import sys
    import warnings

    import matplotlib.pyplot as plt

    import guide

    print("the page's table")
    warnings.warn("a warning every rank would repeat")
    plt.plot([0, 1])
    plt.savefig("figure.png")
    plt.gcf().savefig("figure2.png")
    plt.show()
    print("All checks passed")
    raise ValueError("this rank failed")
""")


def _run_page(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the page as torchrun would start one of its ranks (``env``), or as plain ``python``."""
    script = tmp_path / "page.py"
    script.write_text(PAGE)
    plain = {k: v for k, v in os.environ.items() if k not in (*TORCHRUN_ENV, "RANK", "LOCAL_RANK")}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=50, env={**plain, "MPLBACKEND": "Agg", **env})


def _rank_env(rank: int) -> dict[str, str]:
    return {**TORCHRUN_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank)}


def _prefixed(stderr: str, rank: int) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"[rank {rank}] ")]


def test_rank0_speaks_and_its_traceback_names_it(tmp_path: Path) -> None:
    proc = _run_page(tmp_path, _rank_env(0))
    assert proc.returncode == 1
    assert proc.stdout == "the page's table\nAll checks passed\n"
    assert "a warning every rank would repeat" in proc.stderr
    assert (tmp_path / "figure.png").exists() and (tmp_path / "figure2.png").exists()
    lines = _prefixed(proc.stderr, 0)
    assert lines[0] == "[rank 0] Traceback (most recent call last):", proc.stderr
    assert lines[-1] == "[rank 0] ValueError: this rank failed", proc.stderr


def test_other_ranks_are_silent_until_they_fail(tmp_path: Path) -> None:
    """Rank 2 prints nothing, warns nothing, saves no figure; its failure is all it says."""
    proc = _run_page(tmp_path, _rank_env(2))
    assert proc.returncode == 1
    assert proc.stdout == "" and list(tmp_path.glob("*.png")) == []
    lines = _prefixed(proc.stderr, 2)
    assert proc.stderr.splitlines() == lines, proc.stderr
    assert lines[0] == "[rank 2] Traceback (most recent call last):"
    assert lines[-1] == "[rank 2] ValueError: this rank failed"


def test_outside_torchrun_nothing_changes(tmp_path: Path) -> None:
    proc = _run_page(tmp_path, {})
    assert proc.stdout == "the page's table\nAll checks passed\n"
    assert (tmp_path / "figure.png").exists()
    assert "Traceback (most recent call last)" in proc.stderr and "[rank" not in proc.stderr


def test_torchrun_world_size_mismatch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(guide.LaunchError, match="WORLD_SIZE=4, but the job asks for 2 ranks.*"
                                                "--nproc-per-node=2"):
        guide.launch(sum_of_ranks, 2)


def test_a_script_that_died_skips_the_final_barrier(monkeypatch: pytest.MonkeyPatch) -> None:
    """At exit, a rank whose script raised does not wait for its peers in a last barrier (they may be
    gone, or stuck in another collective): it would only fail again or wait out the timeout."""
    calls: list[str] = []
    monkeypatch.setattr(torchrun, "teardown", lambda: calls.append("teardown"))
    monkeypatch.delattr(sys, "last_value", raising=False)
    torchrun._teardown_unless_failed()
    assert calls == ["teardown"]
    monkeypatch.setattr(sys, "last_value", ValueError("the page failed"), raising=False)
    torchrun._teardown_unless_failed()
    assert calls == ["teardown"]
