"""guide.training: the objective, the loop, the optimizers, the reference (which must learn)."""

from __future__ import annotations

import pytest
import torch

from guide import checks
from guide.data import micro_batches, synthetic_batches
from guide.model import ModelConfig, build_model
from guide.training import OPTIMIZERS, make_optimizer, next_token_loss, reference_run

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
