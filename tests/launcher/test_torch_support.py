"""The torch floor is enforced before a job starts, and gloo's AVG is checked inside every job."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import guide
from guide.launcher import torch_support

from .workers import sum_of_ranks

#: The reduce-scatter check_gloo_avg calls: newer torch's name, or 2.9's.
REDUCE_SCATTER = torch_support.flat_collective_name("reduce_scatter")

# Per-test limit here (tighter than pyproject's): slowest measured 23 s (a subprocess that imports
# guide and torch, or a session's first job with the fork server cold; 2 loaded cores).
pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("version", "ok"), [
    ("2.13.0+cpu", True), ("2.9.0", True), ("2.10.1+cu128", True), ("3.0.0", True),
    ("2.8.1", False), ("1.13.1", False), ("2.9", True), ("nightly", False), ("", False),
])
def test_torch_version_ok(version: str, ok: bool) -> None:
    assert guide.torch_version_ok(version) is ok


def test_unsupported_torch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.8.0+cpu")
    with pytest.raises(guide.LaunchError, match=r"torch 2.8.0\+cpu is not supported.*>=2.9"):
        guide.launch(sum_of_ranks, 2)


def test_gloo_avg_self_check_catches_a_summing_backend() -> None:
    """The launcher refuses a backend whose AVG reduce-scatter sums (pytorch#162338)."""

    def worker(rank: guide.Rank) -> None:
        real = getattr(dist, REDUCE_SCATTER)

        def summing(out, inp, op=dist.ReduceOp.SUM, **kw):
            return real(out, inp, op=dist.ReduceOp.SUM, **kw)

        setattr(dist, REDUCE_SCATTER, summing)
        torch_support.check_gloo_avg(rank.rank, rank.world_size)

    with pytest.raises(guide.RankRaised, match=r"gloo AVG bug \(pytorch#162338\).*2x too large"):
        guide.launch(worker, 2)


def test_gloo_avg_self_check_catches_a_nan() -> None:
    def worker(rank: guide.Rank) -> None:
        real = getattr(dist, REDUCE_SCATTER)

        def poisoned(out, inp, **kw):
            real(out, inp, **kw)
            out.fill_(float("nan"))

        setattr(dist, REDUCE_SCATTER, poisoned)
        torch_support.check_gloo_avg(rank.rank, rank.world_size)

    with pytest.raises(guide.RankRaised, match=r"returned nan instead of the mean 0.5"):
        guide.launch(worker, 2)


def test_flat_collective_names_this_torchs_function() -> None:
    for kind, newer, older in [("all_gather", "all_gather_single", "all_gather_into_tensor"),
                               ("reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor")]:
        name = torch_support.flat_collective_name(kind)
        assert name == (newer if hasattr(dist, newer) else older)
        assert torch_support.flat_collective(kind) is getattr(dist, name)


def test_flat_collective_falls_back_to_torch_2_9s_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(dist, "all_gather_single", raising=False)
    monkeypatch.delattr(dist, "reduce_scatter_single", raising=False)
    assert torch_support.flat_collective("all_gather") is dist.all_gather_into_tensor
    assert torch_support.flat_collective("reduce_scatter") is dist.reduce_scatter_tensor


def test_flat_collective_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError,
                       match=r"one of \['all_gather', 'reduce_scatter'\], got 'all_reduce'"):
        torch_support.flat_collective("all_reduce")
