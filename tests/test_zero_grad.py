"""The shared training loop frees gradients between steps (``zero_grad(set_to_none=True)``).

Zero-filled gradients (``set_to_none=False``) give the same losses, so no loss check notices them;
they only raise every peak by a gradient's size (the OOM page's FSDP2 peak rose from 178 to
197 MiB). The test looks where the difference is: when each step's forward starts, no parameter
may still hold a gradient.
"""

from __future__ import annotations

import pytest
import torch

from guide.data import synthetic_batches
from guide.model import ModelConfig, build_model
from guide.training import make_optimizer, train_steps

pytestmark = pytest.mark.timeout(60)

CFG = ModelConfig(vocab=32, d_model=16, n_layers=1, n_heads=2, d_mlp=32, max_seq=9)


def test_no_gradient_is_allocated_when_a_step_starts() -> None:
    model = build_model(CFG, seed=0)
    opt = make_optimizer("adamw", model.parameters())
    held = []  # per step: parameters holding a gradient as the forward starts
    model.register_forward_pre_hook(
        lambda m, _: held.append(sum(p.grad is not None for p in m.parameters())))
    batches = synthetic_batches(steps=3, batch_size=2, seq_len=8, vocab=CFG.vocab, seed=0)
    train_steps(model, opt, batches)
    assert held == [0, 0, 0]
    # the control: the last backward's gradients are there after the loop (nothing freed them)
    assert all(isinstance(p.grad, torch.Tensor) for p in model.parameters())
