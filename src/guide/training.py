"""The training loop every run shares, and the single-process reference the distributed runs must match.

The loop is deliberately plain: ``zero_grad``, forward, loss, ``backward``, ``step``. Wrapping the model
in ``DDP(...)`` or applying ``fully_shard`` changes *nothing* here; the gradient communication
happens inside ``backward()`` (DDP's reducer hooks, FSDP2's pre/post-backward hooks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from guide.data import rank_slice
from guide.model import ModelConfig, build_model

__all__ = ["OPTIMIZERS", "NonFiniteLoss", "full_state", "make_optimizer", "mean_over_ranks",
           "next_token_loss", "reference_run", "train_steps"]

#: The optimizers the examples compare, with their learning rates. SGD is the sharp instrument
#: (update = lr * grad: a 2x gradient is a 2x step); AdamW normalises the gradient scale away.
OPTIMIZERS: dict[str, Callable[[Sequence[nn.Parameter]], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01),
}


class NonFiniteLoss(FloatingPointError):
    """Training produced a NaN or infinite loss: the run is invalid and must not be reported."""


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    """The optimizer ``name`` (one of :data:`OPTIMIZERS`) over ``params``."""
    try:
        factory = OPTIMIZERS[name]
    except KeyError:
        raise ValueError(
            f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}.") from None
    return factory(list(params))


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
                rank: int = 0, world_size: int = 1,
                device: torch.device | str = "cpu") -> list[float]:
    """Train on each global batch in ``batches`` (``(steps, B, T+1)``); return this rank's losses.

    Each rank takes its own slice of every global batch (:func:`guide.data.rank_slice`). The loss
    is the mean cross-entropy over this rank's tokens; with equal slices the global loss is the
    mean of the ranks' losses (:func:`mean_over_ranks`), computed in the parent so that reporting
    adds no collective to the step being measured.
    """
    losses = []
    for step, batch in enumerate(batches):
        tokens = rank_slice(batch, rank, world_size).to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = next_token_loss(model, tokens)
        loss.backward()
        optimizer.step()
        value = loss.item()
        if not math.isfinite(value):
            raise NonFiniteLoss(f"loss is {value} at step {step} on rank {rank}; the run is invalid.")
        losses.append(value)
    return losses


def mean_over_ranks(per_rank_losses: Sequence[Sequence[float]]) -> list[float]:
    """The global loss per step: the mean of the ranks' losses (their slices are equal in size)."""
    if not per_rank_losses or len({len(r) for r in per_rank_losses}) != 1:
        raise ValueError("every rank must report the same number of steps.")
    return [math.fsum(step) / len(step) for step in zip(*per_rank_losses)]


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a full CPU tensor, by name. FSDP2's DTensors are gathered (a collective:
    every rank must call this); DDP's ``module.`` prefix is dropped, so names match the reference."""
    from torch.distributed.tensor import DTensor

    state = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        state[name.removeprefix("module.")] = full.detach().cpu().clone()
    return state


def reference_run(cfg: ModelConfig, optimizer: str, batches: torch.Tensor,
                  seed: int = 0) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the full global batch: the losses and final parameters a correct DDP or FSDP2
    run must reproduce."""
    model = build_model(cfg, seed)
    losses = train_steps(model, make_optimizer(optimizer, model.parameters()), batches)
    return losses, full_state(model)
