"""The model against published GPU peaks (guide.memory.published): every complete run is within
the tolerance, the data carry their sources, and a formula that drops a part or overcounts is
caught, naming the run."""

from __future__ import annotations

import pytest

from guide.memory import GiB, published
from guide.memory import fit as fit_module
from guide.memory.activations import logits_bytes


def test_every_complete_published_run_is_predicted_within_the_tolerance():
    assert len(published.PUBLISHED) == 4
    for run in published.PUBLISHED:
        assert run.source["url"].startswith("https://github.com/pytorch/torchtitan/")
        assert run.metric == "peak reserved" and run.checkpointing == "selective"
        err = published.check(run)
        assert published.TOLERANCE[0] <= err <= published.TOLERANCE[1]
    # the shard-degree scaling the model must get right: 8 -> 128 GPUs changes model state only
    by_id = {r.id: r for r in published.PUBLISHED}
    drop = (published.predict(by_id[1]) - published.predict(by_id[8])) / GiB
    assert drop == pytest.approx(8030261248 * 16 * (1 / 8 - 1 / 128) / GiB, rel=1e-3)
    assert abs(drop - (by_id[1].value_gib - by_id[8].value_gib)) < 1.5  # published: 15.4


def test_a_dropped_part_is_caught_naming_the_run(monkeypatch):
    """Without the logits and their gradient (the old model) every eager run drifts low."""
    real = published.activation_bytes
    monkeypatch.setattr(published, "activation_bytes", lambda arch, s, b, **kw: real(
        arch, s, b, **kw) - logits_bytes(arch, s, b))
    with pytest.raises(published.DriftedPrediction, match=r"run 1 \(Llama-3.1-8B, 8 GPUs, "
                       r"eager, Table 1 .*\): predicted .* GiB against the published 82.4 GiB"):
        published.check(published.PUBLISHED[0])


def test_an_overcount_is_caught(monkeypatch):
    """A prediction above the measured peak counts something that is not there."""
    real = fit_module.per_gpu

    def bigger(*args, **kw):
        split = real(*args, **kw)
        return fit_module.GpuSplit(**{**split.__dict__, "buffers": split.buffers + 20 * GiB})

    monkeypatch.setattr(published, "per_gpu", bigger)
    with pytest.raises(published.DriftedPrediction, match=r"outside -20%\.\.\+0%"):
        published.check(published.PUBLISHED[0])
