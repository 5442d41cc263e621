"""Workers shared by the launcher tests (module-level, so the ranks import them by reference)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

import guide


def sum_of_ranks(rank: guide.Rank, scale: float = 1.0) -> dict:
    """All-reduce each rank's number: proves the ranks formed one group."""
    t = torch.tensor([float(rank.rank)])
    dist.all_reduce(t)
    return {"rank": rank.rank, "world": rank.world_size, "sum": t * scale, "device": str(rank.device)}


class Pair(NamedTuple):
    """A worker's result as a namedtuple: it must come back as one, its tensors on the CPU."""

    rank: int
    value: torch.Tensor


def named_result(rank: guide.Rank) -> Pair:
    return Pair(rank.rank, torch.ones(2, requires_grad=True) * rank.rank)
