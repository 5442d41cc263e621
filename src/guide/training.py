"""The training loop every run shares (the single-process reference it runs is :mod:`guide.reference`).

The loop is deliberately plain: ``zero_grad``, forward, loss, ``backward``, ``step``. Wrapping the model
in ``DDP(...)`` or applying ``fully_shard`` changes *nothing* here; the gradient communication
happens inside ``backward()`` (DDP's reducer hooks, FSDP2's pre/post-backward hooks).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from guide.data import rank_slice
from guide.launcher.rank import Rank
from guide.layout import ParamLayout
from guide.optimizers import OPTIMIZERS

__all__ = ["NonFiniteLoss", "TrainResult", "make_optimizer", "mean_over_ranks", "next_token_loss",
           "train_steps"]


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a training worker sends back from its rank: the losses it saw and the full parameters
    it ended with; the initial ones and how the rank held each parameter where a page asks."""

    losses: list[float]
    params: dict[str, torch.Tensor]
    initial: dict[str, torch.Tensor] | None = None
    layouts: list[ParamLayout] = dataclasses.field(default_factory=list)


class NonFiniteLoss(FloatingPointError):
    """Training produced a NaN or infinite loss: the run is invalid and must not be reported."""


def make_optimizer(name: str, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer ``name`` (a key of :data:`OPTIMIZERS`) over ``params``.

    Build it *after* ``fully_shard``: the optimizer must hold the sharded (DTensor) parameters.
    """
    try:
        spec = OPTIMIZERS[name]
    except KeyError:
        raise ValueError(
            f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}.") from None
    return spec.factory(list(params))


def next_token_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting ``tokens[:, 1:]`` from ``tokens[:, :-1]`` (a ``(B, T+1)``
    batch): the objective every run on the site minimises. The logits are taken in fp32 (a no-op
    for an fp32 model) so that a low-precision forward does not round the loss itself."""
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be a (batch, seq_len + 1) tensor with seq_len >= 1, got shape "
                         f"{tuple(tokens.shape)}.")
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, batches: torch.Tensor,
                rank: Rank | None = None) -> list[float]:
    """Train on each global batch in ``batches`` (``(steps, B, T+1)``); return this rank's losses.

    ``rank`` is the worker's :class:`guide.Rank` (``None``: one process on the CPU, the reference
    run). Each rank takes its own slice of every global batch (:func:`guide.data.rank_slice`). The
    loss is the mean cross-entropy over this rank's tokens; with equal slices the global loss is the
    mean of the ranks' losses (:func:`mean_over_ranks`), computed in the parent so that reporting
    adds no collective to the step being measured.
    """
    if rank is not None and not isinstance(rank, Rank):
        raise TypeError(f"train_steps takes the worker's guide.Rank (or None for one process), got "
                        f"{type(rank).__name__}: pass `rank`, not `rank.rank, rank.world_size`.")
    index, world_size, device = (0, 1, "cpu") if rank is None else (
        rank.rank, rank.world_size, rank.device)
    losses = []
    for step, batch in enumerate(batches):
        tokens = rank_slice(batch, index, world_size).to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = next_token_loss(model, tokens)
        loss.backward()
        optimizer.step()
        value = loss.item()
        if not math.isfinite(value):
            raise NonFiniteLoss(f"loss is {value} at step {step} on rank {index}; "
                                "the run is invalid.")
        losses.append(value)
    return losses


def mean_over_ranks(per_rank_losses: Sequence[Sequence[float]]) -> list[float]:
    """The global loss per step: the mean of the ranks' losses (their slices are equal in size)."""
    if not per_rank_losses or len({len(r) for r in per_rank_losses}) != 1:
        raise ValueError("every rank must report the same number of steps.")
    return [math.fsum(step) / len(step) for step in zip(*per_rank_losses)]
