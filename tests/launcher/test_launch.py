"""``guide.launch``, the front door: a request that cannot run is refused before any rank starts,
with a :class:`guide.LaunchError` that names the argument and the fix."""

from __future__ import annotations

import pytest

import guide

from .workers import sum_of_ranks

# Per-test limit here (tighter than pyproject's): slowest measured 23 s (a subprocess that imports
# guide and torch, or a session's first job with the fork server cold; 2 loaded cores).
pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("ws", [0, -1, 1.5, "2", True, None])
def test_bad_world_size_is_refused(ws) -> None:
    with pytest.raises(guide.LaunchError,
                       match=r"world_size must be a positive integer \(the number of ranks\)"):
        guide.launch(sum_of_ranks, ws)


@pytest.mark.parametrize("option", ["deadline_s", "collective_timeout_s"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan")])
def test_bad_timeouts_are_refused(option: str, value: float) -> None:
    with pytest.raises(guide.LaunchError, match=f"{option} must be a positive number of seconds"):
        guide.launch(sum_of_ranks, 2, **{option: value})


def test_not_a_function_is_refused() -> None:
    with pytest.raises(guide.LaunchError, match="needs a function"):
        guide.launch("train", 2)


@pytest.mark.parametrize("limit", [0, -5, 1.5, True])
def test_bad_memory_limit_is_refused(limit) -> None:
    with pytest.raises(guide.LaunchError, match="memory_limit_mib must be a positive integer"):
        guide.launch(sum_of_ranks, 2, memory_limit_mib=limit)


def test_public_api_is_re_exported_by_guide() -> None:
    """``guide`` re-exports the launcher's public names, the page declaration and the torch floor,
    nothing else."""
    from guide import launcher, page
    from guide.launcher import torch_support

    assert set(guide.__all__) == {*launcher.__all__, "Page", "SUPPORTED_TORCH", "torch_version_ok"}
    assert guide.Page is page.Page
    assert all(getattr(guide, name) is getattr(launcher, name) for name in launcher.__all__)
    assert guide.SUPPORTED_TORCH == torch_support.SUPPORTED_TORCH
    assert guide.torch_version_ok is torch_support.torch_version_ok


def _rank_id(rank):
    return rank.rank


def test_a_progress_line_per_job_on_request_and_none_otherwise(capfd, monkeypatch):
    import guide

    monkeypatch.setenv("GUIDE_PROGRESS", "1")
    assert guide.launch(_rank_id, 2) == [0, 1]
    err = capfd.readouterr().err
    assert "[guide] _rank_id on 2 ranks ..." in err and "ranks: done in" in err
    monkeypatch.setenv("GUIDE_PROGRESS", "0")
    guide.launch(_rank_id, 2)
    assert "[guide]" not in capfd.readouterr().err
