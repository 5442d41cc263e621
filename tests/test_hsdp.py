"""HSDP's checks bite: every way the layout or the replicas can be wrong fails, by name.

The unit tests feed :func:`guide.checks.assert_hsdp_sharded` and
:func:`guide.checks.assert_replicas_identical` hand-made layouts and shards; the distributed test
runs HSDP on a ``(2, 2)`` mesh of 4 gloo ranks, right and three ways wrong, and checks which guard
catches each fault:

* the cross-replica all-reduce removed (a no-op in its place): the replicas drift apart;
* ``fully_shard`` given the 1-D shard sub-mesh instead of the 2-D mesh: wrong placements, and drift;
* ``set_requires_all_reduce(False)`` left on for every step: FSDP2 keeps the reduce-scattered
  gradients in a private buffer until an all-reduce runs, so ``.grad`` stays empty and *nothing
  trains*. The replicas stay equal (both never move): only the equivalence check catches it.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import guide
from guide import checks
from guide.data import synthetic_batches
from guide.layout import ParamLayout, full_state, local_tensor, param_layouts
from guide.model import ModelConfig, build_model
from guide.training import make_optimizer, mean_over_ranks, train_steps
from guide.reference import reference_run

HSDP = "(Replicate(), Shard(dim=0))"


def _layouts(placements: str = HSDP, rows=lambda rank: (64, 63)[rank % 2]) -> list[ParamLayout]:
    """``w`` (127 x 4) on the 4 ranks of a (2, 2) mesh: chunks of 64 and 63 rows."""
    return [ParamLayout("w", r, True, placements, (127, 4), (rows(r), 4)) for r in range(4)]


def test_hsdp_layout_accepts_uneven_chunks_by_shard_position() -> None:
    checks.assert_hsdp_sharded("ok", _layouts(), 2, 2)
    three = [ParamLayout("w", r, True, HSDP, (127,), ((43, 43, 41)[r % 3],)) for r in range(6)]
    checks.assert_hsdp_sharded("2x3", three, 2, 3)


@pytest.mark.parametrize("placements", ["(Shard(dim=0),)", "(Replicate(), Shard(dim=1))",
                                        "(Shard(dim=0), Replicate())", "(Replicate(), Replicate())",
                                        "(Replicate(),)"])
def test_hsdp_layout_rejects_other_placements(placements: str) -> None:
    with pytest.raises(checks.CheckFailed, match=r"\[HSDP sharding\] x: w on rank 0 has placements "
                                                 r".*expected \(Replicate\(\), Shard\(dim=0\)\): "
                                                 r"fully_shard was not given the 2-D"):
        checks.assert_hsdp_sharded("x", _layouts(placements), 2, 2)


def test_hsdp_layout_rejects_the_chunk_of_another_shard_position() -> None:
    # rank 3 is shard position 1 (63 rows): position 0's chunk (64 rows) is wrong there
    with pytest.raises(checks.CheckFailed, match=r"w on rank 3 \(shard position 1\) holds a local "
                                                 r"shard of shape \(64, 4\); .* gives \(63, 4\)"):
        checks.assert_hsdp_sharded("x", _layouts(rows=lambda r: (64, 63, 64, 64)[r]), 2, 2)
    over_all_four = _layouts(rows=lambda r: (32, 32, 32, 31)[r])  # Shard(0) over 4, not over 2
    with pytest.raises(checks.CheckFailed, match=r"rank 0 \(shard position 0\) holds a local shard "
                                                 r"of shape \(32, 4\)"):
        checks.assert_hsdp_sharded("x", over_all_four, 2, 2)


def test_hsdp_layout_rejects_plain_tensors_and_missing_ranks() -> None:
    plain = [ParamLayout("w", r, False, "-", (127, 4), (127, 4)) for r in range(4)]
    with pytest.raises(checks.CheckFailed, match=r"w on rank 0 is a plain tensor.*not applied"):
        checks.assert_hsdp_sharded("x", plain, 2, 2)
    with pytest.raises(checks.CheckFailed, match=r"layouts from ranks \[0, 1, 2\], expected 0..3"):
        checks.assert_hsdp_sharded("x", _layouts()[:3], 2, 2)
    with pytest.raises(checks.CheckFailed, match="no parameters"):
        checks.assert_hsdp_sharded("x", [], 2, 2)
    with pytest.raises(ValueError, match="shards must be a positive integer"):
        checks.assert_hsdp_sharded("x", _layouts(), 2, 0)


def _shards(steps: int = 3) -> list[list[dict[str, torch.Tensor]]]:
    """Rank -> step -> {name: local shard} for a (2, 2) mesh whose replicas agree."""
    position = [[{"w": torch.full((2,), 10.0 * s + p), "b": torch.zeros(1)} for s in range(steps)]
                for p in range(2)]
    return [[{n: t.clone() for n, t in step.items()} for step in position[r % 2]] for r in range(4)]


def test_replica_check_counts_what_it_compared() -> None:
    assert checks.assert_replicas_identical("ok", _shards(), 2, 2) == 2 * 3 * 2  # positions x steps x params


def test_replica_check_names_the_first_drifting_step_rank_and_parameter() -> None:
    shards = _shards()
    shards[3][1]["w"][0] += 0.5  # rank 3 = replica 1, shard position 1
    with pytest.raises(checks.CheckFailed, match=r"\[HSDP replicas\] x: after step 1, rank 3 \(replica"
                                                 r" 1\) holds a different w shard than rank 1 .*"
                                                 r"max gap 5\.00e-01; the gradients were not all-reduced"):
        checks.assert_replicas_identical("x", shards, 2, 2)


def test_replica_check_catches_a_one_ulp_gap_and_nan() -> None:
    shards = _shards()
    shards[2][2]["w"][1] = torch.nextafter(shards[2][2]["w"][1], torch.tensor(math.inf))
    with pytest.raises(checks.CheckFailed, match=r"after step 2, rank 2 .* than rank 0"):
        checks.assert_replicas_identical("x", shards, 2, 2)
    nan = _shards()
    nan[0][0]["b"][0] = nan[2][0]["b"][0] = math.nan  # equal NaNs are not equal parameters
    with pytest.raises(checks.CheckFailed, match=r"after step 0, rank 2 .* different b shard"):
        checks.assert_replicas_identical("x", nan, 2, 2)


def test_replica_check_rejects_incomplete_reports() -> None:
    shards = _shards()
    with pytest.raises(checks.CheckFailed, match="shards from 3 ranks, expected 4"):
        checks.assert_replicas_identical("x", shards[:3], 2, 2)
    with pytest.raises(checks.CheckFailed, match="shards from 5 ranks, expected 4"):
        checks.assert_replicas_identical("x", [*shards, shards[0]], 2, 2)
    short = _shards()
    short[2] = short[2][:2]
    with pytest.raises(checks.CheckFailed, match="rank 2 reported 2 steps, rank 0 3"):
        checks.assert_replicas_identical("x", short, 2, 2)
    missing = _shards()
    del missing[3][0]["b"]
    with pytest.raises(checks.CheckFailed, match="after step 0, ranks 1 and 3 report different"):
        checks.assert_replicas_identical("x", missing, 2, 2)
    reshaped = _shards()
    reshaped[2][0]["w"] = torch.zeros(3)
    with pytest.raises(checks.CheckFailed, match=r"different w shard.*max gap inf"):
        checks.assert_replicas_identical("x", reshaped, 2, 2)
    with pytest.raises(checks.CheckFailed, match="no shards to compare"):
        checks.assert_replicas_identical("x", [[] for _ in range(4)], 2, 2)


# -- on 4 ranks: the real thing, right and wrong -----------------------------------------------------

CFG = ModelConfig(vocab=64, d_model=32, n_layers=1, n_heads=2, d_mlp=64, max_seq=16)
STEPS = 3
BATCHES = synthetic_batches(steps=STEPS, batch_size=8, seq_len=8, vocab=CFG.vocab, seed=0)


def _hsdp_runs(rank: guide.Rank) -> dict:
    """HSDP on a (2, 2) mesh, trained with SGD, right and with each fault; per fault the layouts,
    the local shards after every step, the losses and the final parameters."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    replicate_ranks = dist.get_process_group_ranks(mesh["replicate"].get_group())
    out = {}
    for fault in ("none", "all-reduce removed", "1-D shard mesh", "set_requires_all_reduce(False)"):
        model = build_model(CFG)
        target = mesh["shard"] if fault == "1-D shard mesh" else mesh
        for block in model.blocks:
            fully_shard(block, mesh=target)
        fully_shard(model, mesh=target)
        if fault == "set_requires_all_reduce(False)":
            model.set_requires_all_reduce(False)
        opt = make_optimizer("sgd", model.parameters())
        real_all_reduce = dist.all_reduce

        def all_reduce(tensor, *args, group=None, **kwargs):
            if group is not None and dist.get_process_group_ranks(group) == replicate_ranks:
                return None  # the fault: the cross-replica all-reduce does not happen
            return real_all_reduce(tensor, *args, group=group, **kwargs)

        if fault == "all-reduce removed":
            dist.all_reduce = all_reduce
        try:
            losses, shards = [], []
            for batch in BATCHES:
                losses += train_steps(model, opt, batch[None], rank)
                shards.append({n: local_tensor(p).detach().clone()
                               for n, p in model.named_parameters()})
        finally:
            dist.all_reduce = real_all_reduce
        out[fault] = {"layouts": param_layouts(model, rank.rank), "shards": shards,
                      "losses": losses, "params": full_state(model)}
    return out


@pytest.fixture(scope="module")
def hsdp() -> dict:
    per_rank = guide.launch(_hsdp_runs, 4)
    return {fault: [r[fault] for r in per_rank] for fault in per_rank[0]}


def _check_all(run: str, ranks: list[dict]) -> None:
    """What the HSDP page asserts of a run."""
    ref_losses, ref_params = reference_run(CFG, "sgd", BATCHES)
    checks.assert_hsdp_sharded(run, [lay for r in ranks for lay in r["layouts"]], 2, 2)
    checks.assert_replicas_identical(run, [r["shards"] for r in ranks], 2, 2)
    checks.assert_losses_match(run, ref_losses, mean_over_ranks([r["losses"] for r in ranks]), against=checks.SINGLE_PROCESS)
    checks.assert_params_match(run, ref_params, ranks[0]["params"], checks.PARAM_TOL["sgd"], against=checks.SINGLE_PROCESS)


def test_hsdp_passes_every_check(hsdp: dict) -> None:
    _check_all("HSDP 2x2", hsdp["none"])


def test_a_missing_cross_replica_all_reduce_makes_the_replicas_drift(hsdp: dict) -> None:
    ranks = hsdp["all-reduce removed"]
    checks.assert_hsdp_sharded("x", [lay for r in ranks for lay in r["layouts"]], 2, 2)  # layout fine
    with pytest.raises(checks.CheckFailed, match=r"\[HSDP replicas\] no all-reduce: after step 0, "
                                                 r"rank 2 \(replica 1\) holds a different"):
        checks.assert_replicas_identical("no all-reduce", [r["shards"] for r in ranks], 2, 2)


def test_the_1d_shard_mesh_fails_the_layout_check_and_drifts(hsdp: dict) -> None:
    ranks = hsdp["1-D shard mesh"]
    with pytest.raises(checks.CheckFailed, match=r"has placements \(Shard\(dim=0\),\), expected"):
        checks.assert_hsdp_sharded("1-D", [lay for r in ranks for lay in r["layouts"]], 2, 2)
    with pytest.raises(checks.CheckFailed, match=r"\[HSDP replicas\] 1-D: after step 0"):
        checks.assert_replicas_identical("1-D", [r["shards"] for r in ranks], 2, 2)


def test_set_requires_all_reduce_false_forever_trains_nothing(hsdp: dict) -> None:
    ranks = hsdp["set_requires_all_reduce(False)"]
    initial = full_state(build_model(CFG))
    assert all(torch.equal(ranks[0]["params"][n], initial[n]) for n in initial)  # never moved
    checks.assert_replicas_identical("x", [r["shards"] for r in ranks], 2, 2)  # blind to it
    with pytest.raises(checks.CheckFailed, match=r"\[loss equivalence\] x: from step 1 on"):
        _check_all("x", ranks)
