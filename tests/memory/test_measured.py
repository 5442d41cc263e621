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
import torch.distributed as dist
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
    StateBytes,
    reducer_bucket_bytes,
    state_bytes_by_rank,
    state_bytes_for_count,
    storage_bytes,
)
from guide.model import ModelConfig, build_model
from guide.training import make_optimizer, train_steps
from guide.optimizers import OPTIMIZERS

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
    (lambda: measure(torch.zeros(3)),
     r"^measure\(\) needs the nn\.Module being trained, got Tensor\.$"),
    (lambda: measure(nn.Linear(2, 2), "adamw"),
     r"^measure\(\) needs a torch\.optim\.Optimizer \(or None\), got str\.$"),
    (lambda: reducer_bucket_bytes(nn.Linear(2, 2)),
     r"^reducer_bucket_bytes\(\) needs a DistributedDataParallel model, got Linear\.$"),
], ids=["model", "optimizer", "ddp"])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_measure_without_an_optimizer_counts_params_and_grads_only():
    model = nn.Linear(4, 3)
    assert measure(model) == StateBytes(params=15 * 4, grads=0, optimizer=0, buckets=0)
    model(torch.randn(2, 4)).sum().backward()
    assert measure(model) == StateBytes(params=15 * 4, grads=15 * 4, optimizer=0, buckets=0)


class _History(torch.optim.Optimizer):
    """An optimizer whose state nests tensors in a list and a tuple (as some optimizers keep a
    history of past gradients): every one of them is memory it holds."""

    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["history"] = [p.grad.clone(), p.grad.clone()]
                state["pair"] = (torch.zeros_like(p), {"deep": [torch.zeros_like(p)]})
                state["count"] = 1  # not a tensor: nothing to count
                state["refs"] = (p, p.grad)  # the parameter and its gradient, not copies




def test_optimizer_state_in_lists_and_tuples_is_counted():
    model = nn.Linear(4, 3, bias=False)
    opt = _History(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    got = measure(model, opt)
    # 2 in the list, 2 in the tuple; the references to the parameter and its gradient add nothing
    # (their storages are already counted as the parameter and the gradient)
    assert (got.params, got.grads, got.optimizer) == (12 * 4, 12 * 4, 4 * 12 * 4)


# -- in one process (a gloo world of one): DDP's reducer, ZeRO-1's wrapper, FSDP2's DTensors -------


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def _one_step(model, opt):
    batches = synthetic_batches(steps=1, batch_size=2, seq_len=8, vocab=_CFG.vocab, seed=0)
    train_steps(model, opt, batches)
    return measure(model, opt)


@pytest.mark.parametrize(("run", "strategy", "buckets"), [
    ("ddp", "ddp", True), ("ddp_bucket_view", "ddp", False), ("zero1", "zero1", True),
    ("fsdp2", "fsdp2", True),
])
def test_measured_equals_predicted_in_a_world_of_one(world_of_one, run, strategy, buckets):
    """The same comparison as on 3 ranks, in this process: DDP's separate buckets are added (and
    not under gradient_as_bucket_view=True), ZeRO-1's state is read from the optimizer it wraps,
    FSDP2's parameters through their local shards."""
    shapes = param_shapes(build_model(_CFG))
    if run == "fsdp2":
        model = sharding.apply_fsdp2(build_model(_CFG), init_device_mesh("cpu", (1,)))
    else:
        model = DistributedDataParallel(build_model(_CFG),
                                        gradient_as_bucket_view=run == "ddp_bucket_view")
    opt = (ZeroRedundancyOptimizer(model.parameters(), optimizer_class=OPTIMIZERS["adamw"].factory)
           if run == "zero1" else make_optimizer("adamw", model.parameters()))
    want = state_bytes_by_rank(shapes, strategy, 1, "fp32", "adamw", ddp_buckets=buckets)[0]
    assert _one_step(model, opt) == want
    assert param_shapes(model) == shapes


def test_reducer_bucket_bytes_sums_every_bucket_in_a_world_of_one(world_of_one):
    """10 KiB buckets (logged as "b0, b1, ..."; see the 3-rank test): all are one gradient copy."""
    model = DistributedDataParallel(build_model(_CFG), bucket_cap_mb=0.01,
                                    find_unused_parameters=True)
    assert model._get_ddp_logging_data()["bucket_sizes"].count(",") >= 2
    grads = sum(math.prod(s) for s in param_shapes(model)) * 4
    assert reducer_bucket_bytes(model) == grads
    assert _one_step(model, make_optimizer("adamw", model.parameters())).buckets == grads


def test_storage_bytes_counts_small_and_skips_empty_storages():
    one_byte = torch.zeros(1, dtype=torch.uint8)
    assert storage_bytes([torch.zeros(0), one_byte, torch.zeros(0), torch.zeros(3)]) == 1 + 12


def test_storage_bytes_shares_its_seen_set_across_calls():
    """One seen set: a storage counted by the first call is not counted by the second (a gradient
    that is a view of a parameter's storage), and the set grows with what was counted."""
    a, b = torch.zeros(4), torch.zeros(2)
    seen: set[tuple[str, int]] = set()
    assert storage_bytes([a], seen) == 16
    assert len(seen) == 1
    assert storage_bytes([a[1:], b], seen) == 8
    assert len(seen) == 2
    # without a set, each call starts afresh
    assert storage_bytes([a]) == storage_bytes([a]) == 16


# -- real ranks -----------------------------------------------------------------------------------------

#: 127 and 17 rows do not split over 3 ranks: FSDP2 pads, ZeRO-1's partition is uneven.
_CFG = ModelConfig(vocab=127, d_model=32, n_layers=1, n_heads=2, d_mlp=64, max_seq=17)
_RUNS = ("ddp", "ddp_bucket_view", "ddp_small_buckets", "zero1", "fsdp2")


def _ranks_worker(rank: guide.Rank) -> dict:
    batches = synthetic_batches(steps=1, batch_size=6, seq_len=8, vocab=_CFG.vocab, seed=0)
    out = {}
    for run in _RUNS:
        if run == "ddp_bucket_view":
            model = DistributedDataParallel(build_model(_CFG), gradient_as_bucket_view=True)
        elif run == "ddp_small_buckets":
            # 10 KiB buckets; DDP logs its initial buckets, which follow the cap only when it
            # looks for unused parameters (else torch starts with one bucket of every gradient)
            model = DistributedDataParallel(build_model(_CFG), bucket_cap_mb=0.01,
                                            find_unused_parameters=True)
        else:
            mesh = init_device_mesh("cpu", (rank.world_size,))
            apply = sharding.apply_fsdp2 if run == "fsdp2" else sharding.apply_ddp
            model = apply(build_model(_CFG), mesh)
        opt = (ZeroRedundancyOptimizer(model.parameters(),
                                       optimizer_class=OPTIMIZERS["adamw"].factory)
               if run == "zero1" else make_optimizer("adamw", model.parameters()))
        train_steps(model, opt, batches, rank)
        reducer = reducer_bucket_bytes(model) if isinstance(model, DistributedDataParallel) else 0
        if run == "ddp_small_buckets":
            out["bucket_sizes"] = model._get_ddp_logging_data()["bucket_sizes"]
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
    runs = ("ddp", "zero1", "ddp_bucket_view", "ddp_small_buckets")
    assert all(r[run][1] == grads for r in results for run in runs)


def test_reducer_buckets_are_summed_over_every_bucket(three_ranks):
    """10 KiB buckets split the gradients into several (DDP logs "b0, b1, ..."): all are counted,
    and measure() adds them to the gradients they copy."""
    shapes, results = three_ranks
    grads = sum(math.prod(s) for s in shapes) * 4
    for r in results:
        assert r["bucket_sizes"].count(",") >= 2
        assert sum(int(b) for b in r["bucket_sizes"].split(", ")) == grads
        got = r["ddp_small_buckets"][0]
        assert got.buckets == got.grads == grads


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
