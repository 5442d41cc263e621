"""guide.training: the objective, the loop, the optimizers, the reference (which must learn)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from guide import checks
from guide.data import micro_batches, synthetic_batches
from guide.launcher.rank import Rank
from guide.model import ModelConfig, build_model
from guide.training import (NonFiniteLoss, make_optimizer, mean_over_ranks, next_token_loss,
                            train_steps)
from guide.optimizers import OPTIMIZERS
from guide.reference import reference_run

TINY = ModelConfig(vocab=32, d_model=16, n_layers=2, n_heads=2, d_mlp=32, max_seq=16)


def test_next_token_loss_predicts_the_next_token():
    """The objective, written out independently: position t predicts token t+1, averaged over every
    position of every row. A shifted target or a sum instead of a mean would fail this."""
    batch = synthetic_batches(1, 4, 8, TINY.vocab, seed=1)[0]
    model = build_model(TINY)
    logits = model(batch[:, :-1])
    by_hand = sum(-torch.log_softmax(logits[r, t], -1)[batch[r, t + 1]]
                  for r in range(4) for t in range(8)) / 32
    assert next_token_loss(model, batch).item() == pytest.approx(by_hand.item(), abs=1e-5)
    with pytest.raises(ValueError, match="batch, seq_len"):
        next_token_loss(model, batch[0])


def test_micro_batches_accumulate_to_the_big_batch_gradient():
    big = synthetic_batches(2, 8, 8, TINY.vocab, seed=2)
    micro = micro_batches(big, 4)
    assert micro.shape == (2, 4, 2, 9)
    assert torch.equal(micro[1, 3], big[1, 6:8])
    ref, acc = build_model(TINY), build_model(TINY)
    next_token_loss(ref, big[0]).backward()
    for m in micro[0]:
        (next_token_loss(acc, m) / 4).backward()
    for (name, p), q in zip(ref.named_parameters(), acc.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name
    # the fault: forgetting to divide by k gives k times the gradient
    wrong = build_model(TINY)
    for m in micro[0]:
        next_token_loss(wrong, m).backward()
    assert not torch.allclose(ref.head.weight.grad, wrong.head.weight.grad, atol=1e-3)
    with pytest.raises(ValueError, match="divisible by 3"):
        micro_batches(big, 3)
    with pytest.raises(ValueError, match="positive integer"):
        micro_batches(big, 0)


def test_one_optimizer_vocabulary() -> None:
    model = build_model(TINY)
    for key, spec in OPTIMIZERS.items():
        opt = make_optimizer(key, model.parameters())
        assert spec.key == key and isinstance(opt, torch.optim.Optimizer)
    assert (OPTIMIZERS["sgd"].moments, OPTIMIZERS["adamw"].moments) == (0, 2)
    with pytest.raises(ValueError, match="unknown optimizer 'adam'"):
        make_optimizer("adam", model.parameters())


def test_the_reference_must_learn(monkeypatch) -> None:
    """The fault of issue 19: ``zero_grad`` between ``backward`` and ``step`` trains nothing; every
    run equivalent to such a reference would pass, so the reference itself refuses it."""
    batches = synthetic_batches(4, 4, 8, TINY.vocab, seed=0)
    losses, _ = reference_run(TINY, "sgd", batches)
    assert losses[0] - min(losses[1:]) >= checks.LEARN_MIN_DROP

    def broken(params):
        opt = torch.optim.SGD(params, lr=0.1)
        step = opt.step
        opt.step = lambda *a, **k: (opt.zero_grad(set_to_none=True), step(*a, **k))[1]
        return opt

    monkeypatch.setitem(OPTIMIZERS, "sgd", OPTIMIZERS["sgd"].__class__(
        "sgd", "SGD", broken, 0, 0))
    with pytest.raises(checks.CheckFailed, match=r"\[training happens\] single-process reference"):
        reference_run(TINY, "sgd", batches)


def _sgd_by_hand(seed: int, batches: torch.Tensor, rows: slice = slice(None)
                 ) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The loop written out without guide.training or torch.optim: plain SGD, lr 0.1 (update =
    lr * grad), on ``rows`` of every batch of a model built from ``seed``."""
    model = build_model(TINY, seed)
    losses = []
    for batch in batches:
        tokens = batch[rows]
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, TINY.vocab), tokens[:, 1:].reshape(-1))
        model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_the_reference_is_plain_sgd_on_the_whole_batch_of_the_seeded_model() -> None:
    batches = synthetic_batches(3, 4, 8, TINY.vocab, seed=3)
    for seed, kwargs in ((0, {}), (1, {"seed": 1})):  # seed 0 is the default
        losses, params = reference_run(TINY, "sgd", batches, **kwargs)
        want_losses, want_params = _sgd_by_hand(seed, batches)
        assert losses == pytest.approx(want_losses, abs=1e-6)
        assert params.keys() == want_params.keys()
        for name, p in params.items():
            assert torch.allclose(p, want_params[name], atol=1e-6), (seed, name)


def test_a_rank_trains_on_its_own_slice_of_every_batch() -> None:
    batches = synthetic_batches(3, 4, 8, TINY.vocab, seed=4)
    model = build_model(TINY, 0)
    losses = train_steps(model, make_optimizer("sgd", model.parameters()), batches,
                         Rank(1, 2, torch.device("cpu"), "gloo"))
    want_losses, want_params = _sgd_by_hand(0, batches, slice(2, 4))  # rank 1 of 2: rows 2, 3
    assert losses == pytest.approx(want_losses, abs=1e-6)
    for name, p in model.named_parameters():
        assert torch.allclose(p, want_params[name], atol=1e-6), name


def test_train_steps_refuses_a_rank_number_for_a_rank() -> None:
    model = build_model(TINY)
    batches = synthetic_batches(1, 4, 8, TINY.vocab, seed=0)
    with pytest.raises(TypeError,
                       match=r"got int: pass `rank`, not `rank\.rank, rank\.world_size`"):
        train_steps(model, make_optimizer("sgd", model.parameters()), batches, 1)


def test_a_non_finite_loss_stops_training_naming_the_step_and_rank() -> None:
    model = build_model(TINY)
    batches = synthetic_batches(2, 4, 8, TINY.vocab, seed=0)
    with torch.no_grad():
        model.head.weight.fill_(math.nan)
    with pytest.raises(NonFiniteLoss,
                       match=r"^loss is nan at step 0 on rank 1; the run is invalid\.$"):
        train_steps(model, make_optimizer("sgd", model.parameters()), batches,
                    Rank(1, 2, torch.device("cpu"), "gloo"))


def test_the_reference_compares_the_same_batch_before_and_after() -> None:
    """A reference that learns nothing fails even when its second batch happens to be harder than
    its first: the check compares the first batch before and after training, not two batches."""
    pool = synthetic_batches(8, 4, 8, TINY.vocab, seed=5)
    model = build_model(TINY)
    with torch.no_grad():
        initial = [next_token_loss(model, b).item() for b in pool]
    order = sorted(range(len(pool)), key=lambda i: initial[i])
    batches = pool[[order[0], order[-1]]]  # the easiest batch first, the hardest second
    assert initial[order[-1]] - initial[order[0]] > 10 * checks.LEARN_MIN_DROP

    def learns_nothing(params):
        return torch.optim.SGD(params, lr=0.0)

    spec = OPTIMIZERS["sgd"]
    try:
        OPTIMIZERS["sgd"] = spec.__class__("sgd", "SGD", learns_nothing, 0, 0)
        with pytest.raises(checks.CheckFailed, match=r"single-process reference, sgd"):
            reference_run(TINY, "sgd", batches)
    finally:
        OPTIMIZERS["sgd"] = spec


def test_mean_over_ranks_is_the_mean_per_step() -> None:
    assert mean_over_ranks([[1.0, 2.0], [3.0, 6.0]]) == [2.0, 4.0]
    assert mean_over_ranks([[0.5]]) == [0.5]
    for bad in ([], [[1.0], [1.0, 2.0]]):
        with pytest.raises(ValueError,
                           match=r"^every rank must report the same number of steps\.$"):
            mean_over_ranks(bad)


def test_next_token_loss_takes_the_shortest_sequence() -> None:
    """seq_len 1: one input token, one target per row."""
    batch = synthetic_batches(1, 3, 1, TINY.vocab, seed=6)[0]
    assert batch.shape == (3, 2)
    model = build_model(TINY)
    logits = model(batch[:, :1])[:, 0]
    by_hand = F.cross_entropy(logits, batch[:, 1])
    assert next_token_loss(model, batch).item() == pytest.approx(by_hand.item(), abs=1e-6)


def test_a_rank_moves_its_slice_to_its_device_before_the_forward() -> None:
    """The rank's device, not the batch's (CPU): seen at the model's input ("meta" stands in for
    an accelerator; the forward is stopped there)."""

    class Stop(Exception):
        pass

    seen = []

    def record(module, args):
        seen.append((args[0].device, tuple(args[0].shape)))
        raise Stop

    model = build_model(TINY)
    model.register_forward_pre_hook(record)
    batches = synthetic_batches(1, 4, 8, TINY.vocab, seed=0)
    with pytest.raises(Stop):
        train_steps(model, make_optimizer("sgd", model.parameters()), batches,
                    Rank(0, 2, torch.device("meta"), "gloo"))
    assert seen == [(torch.device("meta"), (2, 8))]
