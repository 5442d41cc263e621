"""guide.precision, guide.steps and guide.knob_plots: the plumbing of the FSDP2-knob pages.

Each guard is shown to catch the fault it exists for: a wrong dtype, a doubled gradient against the
bf16 loss bound, micro-batches that do not add up to the big batch, a shard-local norm.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

import guide  # noqa: E402
from guide import knob_plots, precision, steps  # noqa: E402
from guide.checks import CheckFailed  # noqa: E402
from guide.data import synthetic_batches  # noqa: E402
from guide.model import ModelConfig, build_model  # noqa: E402
from guide.training import make_optimizer, train_steps  # noqa: E402

TINY = ModelConfig(vocab=32, d_model=16, n_layers=2, n_heads=2, d_mlp=32, max_seq=16)


# -- precision: dtypes ------------------------------------------------------------------------------

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


# -- steps --------------------------------------------------------------------------------------

def test_next_token_loss_predicts_the_next_token():
    """The objective, written out independently: position t predicts token t+1, averaged over every
    position of every row. A shifted target or a sum instead of a mean would fail this."""
    batch = synthetic_batches(1, 4, 8, TINY.vocab, seed=1)[0]
    model = build_model(TINY)
    logits = model(batch[:, :-1])
    by_hand = sum(-torch.log_softmax(logits[r, t], -1)[batch[r, t + 1]]
                  for r in range(4) for t in range(8)) / 32
    assert steps.next_token_loss(model, batch).item() == pytest.approx(by_hand.item(), abs=1e-5)
    with pytest.raises(ValueError, match="batch, seq_len"):
        steps.next_token_loss(model, batch[0])


def test_micro_batches_accumulate_to_the_big_batch_gradient():
    big = synthetic_batches(2, 8, 8, TINY.vocab, seed=2)
    micro = steps.micro_batches(big, 4)
    assert micro.shape == (2, 4, 2, 9)
    assert torch.equal(micro[1, 3], big[1, 6:8])
    ref, acc = build_model(TINY), build_model(TINY)
    steps.next_token_loss(ref, big[0]).backward()
    for m in micro[0]:
        (steps.next_token_loss(acc, m) / 4).backward()
    for (name, p), q in zip(ref.named_parameters(), acc.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name
    # the fault: forgetting to divide by k gives k times the gradient
    wrong = build_model(TINY)
    for m in micro[0]:
        steps.next_token_loss(wrong, m).backward()
    assert not torch.allclose(ref.head.weight.grad, wrong.head.weight.grad, atol=1e-3)
    with pytest.raises(ValueError, match="divisible by 3"):
        steps.micro_batches(big, 3)
    with pytest.raises(ValueError, match="positive integer"):
        steps.micro_batches(big, 0)


def test_local_grad_norm_of_a_whole_model_is_clip_grad_norm():
    model = build_model(TINY)
    steps.next_token_loss(model, synthetic_batches(1, 4, 8, TINY.vocab)[0]).backward()
    local = steps.local_grad_norm(model)
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
    assert local == pytest.approx(total, rel=1e-6)


# -- in ranks: gloo's bf16 support, a shard's norm, a phased step ------------------------------------

def _rank_worker(rank: guide.Rank) -> dict:
    from guide.data import rank_slice
    from guide.peak_memory import prepare
    from guide.sharding import wrap

    prepare()
    support = precision.collective_support(torch.bfloat16)
    model = wrap(build_model(TINY), "FSDP2", rank)
    opt = make_optimizer("sgd", model.parameters())
    tokens = rank_slice(synthetic_batches(2, 4, 8, TINY.vocab)[0], rank.rank, rank.world_size)
    step = steps.measured_step(model, opt, tokens)
    local = steps.local_grad_norm(model)
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).full_tensor().item()
    return {"support": support, "step": step, "local": local, "total": total}


def test_in_ranks_bf16_collectives_shard_norms_and_measured_step():
    results = guide.launch(_rank_worker, 2)
    assert set(results[0]["support"].values()) == {"ok"}, results[0]["support"]
    # a shard's norm is not the norm; the squares of the shards' norms add up to its square
    total = results[0]["total"]
    assert all(r["local"] < total for r in results)
    assert sum(r["local"] ** 2 for r in results) == pytest.approx(total ** 2, rel=1e-5)
    step = results[0]["step"]
    assert step.peak_bytes >= step.held_after_forward_bytes and step.loss > 0


def test_collective_support_rejects_non_float_dtypes():
    with pytest.raises(ValueError, match="floating dtypes"):
        precision.collective_support(torch.int32)


# -- knob_plots ---------------------------------------------------------------------------------

def test_charts_draw_and_reject_mismatched_input():
    fig = knob_plots.gap_vs_bound({"a": [0.0, 1e-4]}, {"a": [1e-2, 1e-2]})
    assert fig.axes[0].get_yscale() == "log"
    with pytest.raises(ValueError, match="one bound sequence per run"):
        knob_plots.gap_vs_bound({"a": [0.0]}, {"b": [1.0]})
    knob_plots.clip_norms([1.0, 0.5], {"FSDP2 x2": [1.0, 0.5]}, {"rank 0": [0.7, 0.3]}, 0.9)
    knob_plots.reshard_tradeoff({"True": {"forward": 5, "backward": 5}}, {"True": 0.0},
                                {"True": 10.0}, {"True": 100.0}, 4)
    knob_plots.accumulation_tradeoff({"DDP, x": 2, "FSDP2, y": 5}, {"DDP, x": 1.0, "FSDP2, y": 2.0},
                                     4, 2)
    import matplotlib.pyplot as plt

    plt.close("all")
