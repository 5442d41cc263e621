"""What every equivalence check assumes: the global batch is split over the ranks into equal,
disjoint, in-order slices (guide.data.rank_slice), and the global loss is the mean of the ranks'
losses (guide.training.mean_over_ranks). A bug in either used to be caught only by the examples.
"""

from __future__ import annotations

import math

import pytest
import torch

from guide.data import rank_slice
from guide.training import mean_over_ranks


@pytest.mark.parametrize("batch, world_size", [(8, 1), (8, 2), (12, 3), (8, 4), (16, 8), (6, 6)])
def test_rank_slices_are_equal_disjoint_and_in_order(batch: int, world_size: int) -> None:
    """Rank r gets rows [r*B/N, (r+1)*B/N): concatenated in rank order they are the batch itself."""
    global_batch = torch.arange(batch * 3).reshape(batch, 3)
    slices = [rank_slice(global_batch, r, world_size) for r in range(world_size)]
    assert [len(s) for s in slices] == [batch // world_size] * world_size
    assert torch.equal(torch.cat(slices), global_batch)


def test_a_rank_slice_keeps_the_trailing_dimensions() -> None:
    batches = torch.arange(4 * 6 * 5).reshape(4, 6, 5)  # (batch, seq_len + 1, ...) stays intact
    assert torch.equal(rank_slice(batches, 1, 2), batches[2:4])


@pytest.mark.parametrize("rank, world_size", [(2, 2), (-1, 2), (0, 0), (0, -2), (3, 2)])
def test_a_rank_outside_the_world_is_refused(rank: int, world_size: int) -> None:
    with pytest.raises(ValueError, match=rf"^rank {rank} is not in a world of size {world_size}\.$"):
        rank_slice(torch.zeros(8, 5), rank, world_size)


@pytest.mark.parametrize("batch, world_size", [(7, 2), (8, 3), (2, 4)])
def test_a_batch_that_does_not_split_evenly_is_refused(batch: int, world_size: int) -> None:
    """Unequal slices would make the mean of the ranks' mean losses a reweighted objective."""
    with pytest.raises(ValueError, match=rf"^a global batch of {batch} rows does not split evenly "
                                         rf"over {world_size} ranks; use a batch size divisible by "
                                         rf"{world_size}\.$"):
        rank_slice(torch.zeros(batch, 5), 0, world_size)


def test_the_global_loss_is_the_mean_of_the_ranks_not_the_sum() -> None:
    assert mean_over_ranks([[1.0, 2.0], [3.0, 6.0]]) == [2.0, 4.0]
    assert mean_over_ranks([[1.0, 4.0], [2.0, 5.0], [6.0, 0.0]]) == [3.0, 3.0]
    assert mean_over_ranks([[0.5, 0.25, 2.0]]) == [0.5, 0.25, 2.0]  # one rank: its own losses


def test_the_global_loss_is_summed_exactly() -> None:
    """math.fsum: no rounding in the sum, so the mean matches a one-process reference's loss."""
    assert mean_over_ranks([[1e16], [1.0], [-1e16], [2.0]]) == [0.75]


@pytest.mark.parametrize("per_rank", [[], [[1.0], [1.0, 2.0]], [[1.0, 2.0], [1.0]]])
def test_ranks_reporting_different_numbers_of_steps_are_refused(per_rank: list) -> None:
    with pytest.raises(ValueError, match=r"^every rank must report the same number of steps\.$"):
        mean_over_ranks(per_rank)


def test_a_nan_on_one_rank_reaches_the_global_loss() -> None:
    """The loss checks catch NaN only if averaging does not hide it."""
    assert math.isnan(mean_over_ranks([[1.0, 2.0], [math.nan, 2.0]])[0])
