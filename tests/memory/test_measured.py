"""guide.memory.measured: what a live rank holds, read off its tensors, equals what is predicted.

Single-process tests pin down the storage counting; one job of 3 gloo ranks (uneven shards, ZeRO-1's
uneven partition) compares every rank's measured bytes with the prediction, buckets included, and
proves that the comparison would notice a wrong model (no padding, an even ZeRO-1 split, buckets
under gradient_as_bucket_view=True).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import guide
from guide import sharding
from guide.data import synthetic_batches
from guide.memory import (
    measure,
    param_shapes,
    reducer_bucket_bytes,
    state_bytes_by_rank,
    state_bytes_for_count,
)
from guide.model import ModelConfig, build_model
from guide.training import OPTIMIZERS, make_optimizer, train_steps

# -- single process ------------------------------------------------------------------------------------


def test_measure_counts_a_shared_storage_once():
    lin = nn.Linear(4, 3, bias=False)
    model = nn.Sequential(lin, nn.Linear(3, 4, bias=False))
    model[1].weight = nn.Parameter(lin.weight.data.t())  # same storage, transposed view: a tied weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    got = measure(model, opt)
    assert got.params == 12 * 4  # one storage, not two
    assert got.grads == 2 * 12 * 4  # the grads are separate tensors
    assert got.optimizer == 2 * (2 * 12 * 4 + 4)
    assert got.buckets == 0  # not a DDP model


@pytest.mark.parametrize(("call", "match"), [
    (lambda: measure(torch.zeros(3)), "nn.Module"),
    (lambda: measure(nn.Linear(2, 2), "adamw"), "torch.optim.Optimizer"),
    (lambda: reducer_bucket_bytes(nn.Linear(2, 2)), "DistributedDataParallel"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- real ranks -----------------------------------------------------------------------------------------

#: 127 and 17 rows do not split over 3 ranks: FSDP2 pads, ZeRO-1's partition is uneven.
_CFG = ModelConfig(vocab=127, d_model=32, n_layers=1, n_heads=2, d_mlp=64, max_seq=17)
_RUNS = ("ddp", "ddp_bucket_view", "zero1", "fsdp2")


def _ranks_worker(rank: guide.Rank) -> dict:
    batches = synthetic_batches(steps=1, batch_size=6, seq_len=8, vocab=_CFG.vocab, seed=0)
    out = {}
    for run in _RUNS:
        if run == "ddp_bucket_view":
            model = DistributedDataParallel(build_model(_CFG), gradient_as_bucket_view=True)
        else:
            mesh = init_device_mesh("cpu", (rank.world_size,))
            apply = sharding.apply_fsdp2 if run == "fsdp2" else sharding.apply_ddp
            model = apply(build_model(_CFG), mesh)
        opt = (ZeroRedundancyOptimizer(model.parameters(),
                                       optimizer_class=OPTIMIZERS["adamw"].factory)
               if run == "zero1" else make_optimizer("adamw", model.parameters()))
        train_steps(model, opt, batches, rank)
        reducer = reducer_bucket_bytes(model) if isinstance(model, DistributedDataParallel) else 0
        out[run] = (measure(model, opt), reducer)
        if run == "fsdp2":  # after fully_shard: still the global shapes
            out["fsdp2_shapes"] = param_shapes(model)
        del model, opt
    return out


@pytest.fixture(scope="module")
def three_ranks():
    return param_shapes(build_model(_CFG)), guide.launch(_ranks_worker, 3)


def test_param_shapes_are_the_global_shapes_after_fully_shard(three_ranks):
    """127 rows over 3 ranks: a rank's shard has 43 (or 41) rows, param_shapes still says 127."""
    shapes, results = three_ranks
    assert (127, 32) in shapes
    assert all(r["fsdp2_shapes"] == shapes for r in results)


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp2"])
def test_measured_equals_predicted_on_every_rank(three_ranks, strategy):
    """Every component of every rank, DDP's buckets included, to the byte."""
    shapes, results = three_ranks
    want = state_bytes_by_rank(shapes, strategy, 3, "fp32", "adamw", ddp_buckets=True)
    assert [r[strategy][0] for r in results] == want


def test_reducer_buckets_are_one_more_gradient_copy(three_ranks):
    shapes, results = three_ranks
    grads = sum(math.prod(s) for s in shapes) * 4
    assert all(r[run][1] == grads for r in results for run in ("ddp", "zero1", "ddp_bucket_view"))


def test_bucket_view_is_the_no_buckets_prediction(three_ranks):
    """With gradient_as_bucket_view=True the reducer's buckets *are* the gradients: measure counts
    them once (as gradients), which is the ddp_buckets=False prediction, not the default one."""
    shapes, results = three_ranks
    off = state_bytes_by_rank(shapes, "ddp", 3, "fp32", "adamw", ddp_buckets=False)
    on = state_bytes_by_rank(shapes, "ddp", 3, "fp32", "adamw", ddp_buckets=True)
    got = [r["ddp_bucket_view"][0] for r in results]
    assert got == off and got != on


def test_a_model_without_padding_would_be_caught(three_ranks):
    """127 and 17 rows do not split over 3 ranks: an ideal 1/N model is measurably wrong."""
    shapes, results = three_ranks
    naive = math.ceil(sum(math.prod(s) for s in shapes) / 3) * 4
    assert results[0]["fsdp2"][0].params > naive


def test_a_model_with_an_even_zero1_split_would_be_caught(three_ranks):
    """ZeRO-1 splits by parameter, not evenly: the measured shares differ from 1/N."""
    shapes, results = three_ranks
    measured = [r["zero1"][0].optimizer for r in results]
    ideal = state_bytes_for_count(sum(math.prod(s) for s in shapes), "zero1", 3, "fp32", "adamw",
                                  ddp_buckets=True).optimizer
    assert len(set(measured)) > 1 and max(measured) != ideal
