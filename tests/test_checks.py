"""The checks on real models: layouts read from FSDP2 and DDP models that ran, a loss that became
inf, and the clear errors for inputs the guide cannot use.

The negative tests of each guard on hand-made inputs (every way it can be fooled) are in
tests/checks/."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

import guide
from guide import checks, layout
from guide.data import rank_slice, synthetic_batches
from guide.model import ModelConfig, build_model
from guide.training import NonFiniteLoss, make_optimizer, mean_over_ranks, train_steps


@pytest.mark.parametrize("dim0", [1, 2, 3, 7, 63, 64, 127, 128, 256])
@pytest.mark.parametrize("ws", [1, 2, 3, 4, 8])
def test_expected_shard_rows_follow_torch_chunk(dim0: int, ws: int) -> None:
    chunks = torch.arange(dim0).chunk(ws)
    rows = [layout.chunk_rows(dim0, r, ws) for r in range(ws)]
    assert rows == [len(c) for c in chunks] + [0] * (ws - len(chunks))
    assert sum(rows) == dim0


def _fsdp2_layouts(rank: guide.Rank, cfg: ModelConfig, shard: bool) -> list:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = build_model(cfg)
    if shard:
        mesh = init_device_mesh("cpu", (rank.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return layout.param_layouts(model, rank.rank)


UNEVEN = ModelConfig(vocab=127, d_model=48, n_layers=1, n_heads=4, d_mlp=100, max_seq=20)


def test_uneven_shards_on_three_ranks_pass_the_sharding_check() -> None:
    """vocab 127 over 3 ranks -> 43/43/41 rows; d_mlp 100 -> 34/34/32: the check accepts real FSDP2."""
    layouts = [lay for r in guide.launch(_fsdp2_layouts, 3, UNEVEN, True) for lay in r]
    checks.assert_sharded("FSDP2 x3", layouts, 3)
    emb = {lay.rank: lay.local_shape for lay in layouts if lay.name == "tok_emb.weight"}
    assert emb == {0: (43, 48), 1: (43, 48), 2: (41, 48)}


def test_unsharded_model_fails_the_sharding_check_by_name() -> None:
    layouts = [lay for r in guide.launch(_fsdp2_layouts, 2, UNEVEN, False) for lay in r]
    with pytest.raises(checks.CheckFailed, match=r"\[sharding\] FSDP2 x2: tok_emb.weight on rank 0 "
                                                 r"is a plain tensor.*fully_shard was not applied"):
        checks.assert_sharded("FSDP2 x2", layouts, 2)


def test_non_finite_loss_stops_training() -> None:
    model = build_model(ModelConfig(n_layers=1))
    with torch.no_grad():
        model.head.weight.fill_(math.inf)
    batches = synthetic_batches(2, 2, 8, 128)
    with pytest.raises(NonFiniteLoss, match="step 0 on rank 0; the run is invalid"):
        train_steps(model, make_optimizer("sgd", model.parameters()), batches)


def test_bad_inputs_get_clear_errors() -> None:
    with pytest.raises(ValueError, match="does not split evenly over 3 ranks"):
        rank_slice(torch.zeros(8, 5), 0, 3)
    with pytest.raises(ValueError, match="rank 2 is not in a world of size 2"):
        rank_slice(torch.zeros(8, 5), 2, 2)
    with pytest.raises(ValueError, match="d_model=64 must be divisible by n_heads=5"):
        ModelConfig(n_heads=5)
    with pytest.raises(ValueError, match="n_layers must be a positive integer"):
        ModelConfig(n_layers=0)
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        make_optimizer("lamb", [])
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        synthetic_batches(0, 2, 8, 128)
    with pytest.raises(ValueError, match="same number of steps"):
        mean_over_ranks([[1.0], [1.0, 2.0]])
    with pytest.raises(ValueError, match="exceeds ModelConfig.max_seq=32"):
        build_model()(torch.zeros(1, 40, dtype=torch.long))


def _wrapped_layouts(rank: guide.Rank, strategy: str) -> list:
    from guide import sharding

    mesh = init_device_mesh("cpu", (rank.world_size,))
    apply = sharding.apply_ddp if strategy == "DDP" else sharding.apply_fsdp2
    return layout.param_layouts(apply(build_model(UNEVEN), mesh), rank.rank)


def test_apply_ddp_and_apply_fsdp2_apply_each_policy() -> None:
    fsdp = [lay for r in guide.launch(_wrapped_layouts, 2, "FSDP2") for lay in r]
    checks.assert_sharded("wrap FSDP2", fsdp, 2)
    ddp = [lay for r in guide.launch(_wrapped_layouts, 2, "DDP") for lay in r]
    checks.assert_replicated("wrap DDP", ddp, {n: p.shape for n, p in
                                               build_model(UNEVEN).named_parameters()})
