"""A training step taken apart: the pieces the FSDP2-knob pages write their own loops with.

:func:`guide.training.train_steps` is the whole step in one call. The pages on gradient accumulation
and gradient clipping need to put something *between* backward and the optimizer step (a skipped
gradient sync, a ``clip_grad_norm_``), so they write the loop themselves, from these pieces:

* :func:`next_token_loss` (from :mod:`guide.training`): the loss of one token batch, the objective
  ``train_steps`` minimises;
* :func:`micro_batches`: a global batch of ``k * B`` sequences as ``k`` micro-batches of ``B``;
* :func:`local_grad_norm`: the gradient norm one rank could compute alone, from its own shards;
* :func:`measured_step`: one step with the memory its forward leaves behind and its peak.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from guide.training import next_token_loss  # noqa: F401 (re-exported for the knob pages)

__all__ = ["PhasedStep", "local_grad_norm", "measured_step", "micro_batches"]


def micro_batches(batches: torch.Tensor, k: int) -> torch.Tensor:
    """Split each global batch of ``(steps, k * B, T+1)`` into ``k`` consecutive micro-batches:
    ``(steps, k, B, T+1)``, micro-batch ``m`` holding rows ``[m*B, (m+1)*B)``.

    Accumulating the gradients of the ``k`` micro-batches, each loss divided by ``k``, gives the
    gradient of the mean loss over all ``k * B`` rows: the gradient of one step on the big batch.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (micro-batches per step) must be a positive integer, got {k!r}.")
    if batches.dim() != 3:
        raise ValueError(f"batches must be (steps, batch, seq_len + 1), got shape "
                         f"{tuple(batches.shape)}.")
    if batches.shape[1] % k:
        raise ValueError(f"a batch of {batches.shape[1]} sequences does not split into {k} equal "
                         f"micro-batches; use a batch size divisible by {k}.")
    return batches.unflatten(1, (k, batches.shape[1] // k))


def local_grad_norm(model: nn.Module) -> float:
    """The 2-norm of the gradients *this rank holds*: for FSDP2, the norm of its shards only.

    Under ``Shard(0)`` the ranks' shards partition every gradient, so the squares of the ranks'
    local norms add up to the square of the true norm. A rank that clipped with its local norm
    would scale its shards by a different factor than its peers: the full gradient would no longer
    point where the unsharded one does.
    """
    from guide.model_state import local_tensor

    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            total += float(local_tensor(p.grad).detach().double().pow(2).sum())
    return math.sqrt(total)


@dataclasses.dataclass(frozen=True)
class PhasedStep:
    """One training step measured by phase, on one rank (see :func:`measured_step`).

    ``held_after_forward_bytes``: memory the forward left behind (activations saved for backward,
    plus whatever parameters FSDP2 kept unsharded); ``peak_bytes``: the step's peak above the level
    before the forward; ``loss``: its loss. (No time: the measurement itself runs a garbage
    collection per phase; time steps without it.)
    """

    loss: float
    held_after_forward_bytes: int
    peak_bytes: int


def measured_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                  tokens: torch.Tensor) -> PhasedStep:
    """Run one step on ``tokens`` (``zero_grad``, forward, backward, ``step``), measuring the memory
    the forward leaves behind and the step's peak with :class:`guide.peak_memory.PeakMemory`.

    The process must be prepared (:func:`guide.peak_memory.prepare`) and should have run a warm-up
    step. The peak is ``max(forward peak, held after forward + backward-and-step peak)``, both
    relative to the level before the forward.
    """
    from guide.peak_memory import PeakMemory

    optimizer.zero_grad(set_to_none=True)
    with PeakMemory() as fwd:
        loss = next_token_loss(model, tokens)
    with PeakMemory() as rest:
        loss.backward()
        optimizer.step()
    return PhasedStep(loss.item(), fwd.end_bytes, max(fwd.peak_bytes, fwd.end_bytes + rest.peak_bytes))
