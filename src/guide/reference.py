"""The single-process reference every distributed run must match: one process, the whole batch.

Above the training loop and the checks it uses: a reference that does not learn proves nothing, so
it asserts that its loss falls (:func:`guide.checks.assert_learns`) before any run is compared
with it.
"""

from __future__ import annotations

import torch

from guide.checks import assert_learns
from guide.layout import full_state
from guide.model import ModelConfig, build_model
from guide.training import make_optimizer, next_token_loss, train_steps

__all__ = ["reference_run"]


def reference_run(cfg: ModelConfig, optimizer: str, batches: torch.Tensor,
                  seed: int = 0) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the full global batch: the losses and final parameters a correct DDP or FSDP2
    run must reproduce. Raises :class:`guide.checks.CheckFailed` if its loss does not fall
    (:func:`guide.checks.assert_learns`): a run that matches a reference that does not learn proves
    nothing."""
    model = build_model(cfg, seed)
    losses = train_steps(model, make_optimizer(optimizer, model.parameters()), batches)
    with torch.no_grad():  # the first batch again, after training: the same data, so only learning
        after = next_token_loss(model, batches[0]).item()  # can lower its loss
    assert_learns(f"single-process reference, {optimizer}", [losses[0], after])
    return losses, full_state(model)
