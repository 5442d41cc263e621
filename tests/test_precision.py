"""guide.precision: which dtype each tensor has under mixed precision, bf16's rounding and the
loss-gap bound. Each guard is shown to catch the fault it exists for: a wrong dtype, a doubled
gradient against the bf16 loss bound, gloo collectives that cannot carry bf16."""

from __future__ import annotations

import pytest
import torch

import guide
from guide import precision
from guide.checks import CheckFailed
from guide.data import synthetic_batches
from guide.model import ModelConfig, build_model
from guide.training import train_steps

TINY = ModelConfig(vocab=32, d_model=16, n_layers=2, n_heads=2, d_mlp=32, max_seq=16)

def test_unit_roundoff_is_half_the_spacing_above_one():
    assert precision.unit_roundoff(torch.bfloat16) == 2.0 ** -8
    assert precision.unit_roundoff(torch.float32) == 2.0 ** -24
    # rounding 1 + u/2 to bf16 gives 1: half an ulp is below the resolution, as u says
    assert torch.tensor(1 + 2.0 ** -9).to(torch.bfloat16).item() == 1.0
    with pytest.raises(ValueError, match="floating dtype"):
        precision.unit_roundoff(torch.int64)


def test_assert_dtypes_names_the_offending_tensor():
    assert precision.assert_dtypes("run", "grads", {"a": torch.float32, "b": torch.float32},
                                   torch.float32) == 2
    with pytest.raises(CheckFailed, match=r"grads: b is bfloat16, expected float32"):
        precision.assert_dtypes("run", "grads", {"a": torch.float32, "b": torch.bfloat16},
                                torch.float32)
    with pytest.raises(CheckFailed, match="nothing to check"):
        precision.assert_dtypes("run", "grads", {}, torch.float32)


def test_forward_dtypes_sees_what_layers_compute_with_and_removes_its_hooks():
    model = build_model(TINY)
    tokens = torch.zeros(2, 8, dtype=torch.long)
    with precision.ForwardDtypes(model) as fwd:
        model(tokens)
    assert set(fwd.params.values()) == {torch.float32}
    assert fwd.param_shapes["blocks.0.fc1.weight"] == (32, 16)
    assert fwd.param_kinds["head.weight"] == "Tensor"
    assert fwd.outputs[""] == torch.float32 and fwd.outputs["blocks.1"] == torch.float32
    assert all(not m._forward_hooks for m in model.modules())
    model.to(torch.bfloat16)  # the fault: a bf16 model must be reported as bf16, not fp32
    with precision.ForwardDtypes(model) as fwd:
        model(tokens)
    with pytest.raises(CheckFailed, match="is bfloat16, expected float32"):
        precision.assert_dtypes("bf16 model", "parameters used in forward", fwd.params,
                                torch.float32)
    assert precision.stored_dtypes(model)["head.weight"] == torch.bfloat16
    assert set(precision.grad_dtypes(model).values()) == {None}


# -- precision: the loss-gap bound -----------------------------------------------------------------

def _sgd_losses(lr: float, batches) -> list[float]:
    model = build_model(TINY)
    return train_steps(model, torch.optim.SGD(model.parameters(), lr=lr), batches)


def test_loss_gap_bound_rejects_a_doubled_gradient_and_accepts_the_same_run():
    batches = synthetic_batches(6, 8, 8, TINY.vocab, seed=0)
    reference = _sgd_losses(0.1, batches)
    bounds = precision.loss_gap_bound(reference, torch.bfloat16)
    assert bounds[0] == pytest.approx(reference[0] / 256)
    assert precision.assert_loss_gap_within("same run", reference, reference, bounds) == 0.0
    # the fault: gradients summed over 2 ranks instead of averaged = an SGD step twice as long
    doubled = _sgd_losses(0.2, batches)
    with pytest.raises(CheckFailed, match=r"\[loss gap\] doubled gradient: step [1-5]"):
        precision.assert_loss_gap_within("doubled gradient", reference, doubled, bounds)
    with pytest.raises(CheckFailed, match="must be equal"):
        precision.assert_loss_gap_within("short", reference, reference[:-1], bounds)
    with pytest.raises(CheckFailed, match="above the bound"):
        precision.assert_loss_gap_within("nan", reference, [float("nan")] * 6, bounds)
    with pytest.raises(ValueError, match="reference"):
        precision.loss_gap_bound([])


def test_lost_update_fraction_counts_updates_bf16_cannot_hold():
    before = torch.tensor([1.0, 1.0, 1.0, 1.0])
    after = torch.tensor([1.0 + 2.0 ** -10, 1.0 + 2.0 ** -6, 1.0, 0.5])
    # changed: 3 elements; 1 + 2**-10 rounds back to 1 in bf16, the other two survive
    assert precision.lost_update_fraction([before], [after]) == pytest.approx(1 / 3)
    assert precision.lost_update_fraction([before], [after], torch.float32) == 0.0
    with pytest.raises(ValueError, match="changed no parameter"):
        precision.lost_update_fraction([before], [before.clone()])
    with pytest.raises(ValueError, match="same parameters"):
        precision.lost_update_fraction([before], [after[:2]])


def _bf16_support(rank: guide.Rank) -> dict:
    return precision.collective_support(torch.bfloat16)


def test_in_ranks_gloo_carries_bf16_collectives():
    support = guide.launch(_bf16_support, 2)[0]
    assert set(support.values()) == {"ok"}, support


def test_collective_support_rejects_non_float_dtypes():
    with pytest.raises(ValueError, match="floating dtypes"):
        precision.collective_support(torch.int32)
