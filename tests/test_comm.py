"""guide.comm: the collective counter sees what DDP, FSDP2 and ZeRO-1 issue, and the model predicts it.

The launched tests run 2 gloo ranks (a few seconds each); the rest are pure arithmetic.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.distributed as dist

import guide
from guide import checks, comm
from guide.comm import Collective, CollectiveLog, FSDPGroup


# -- the analytical model ----------------------------------------------------------------------------

def test_padded_numel_follows_torch_chunk():
    assert comm.fsdp2_padded_numel((127, 64), 2) == 128 * 64
    assert comm.fsdp2_padded_numel((64,), 3) == 66
    assert comm.fsdp2_padded_numel((128, 64), 2) == 128 * 64
    assert comm.fsdp2_padded_numel((5,), 4) == 8
    assert comm.fsdp2_padded_numel((), 2) == 2  # a scalar is one row


def test_fsdp2_step_counts_calls_per_group():
    groups = [FSDPGroup(((8, 4),), True), FSDPGroup(((8, 4),), True), FSDPGroup(((16,),), False)]
    step = comm.fsdp2_step(groups, 2)
    kinds = [(c.kind, c.phase) for c in step]
    assert kinds.count(("all_gather", "forward")) == 3
    assert kinds.count(("all_gather", "backward")) == 2  # the non-resharding group keeps its params
    assert kinds.count(("reduce_scatter", "backward")) == 3


def test_zero_element_ratio_is_one_and_a_half_and_bytes_follow_dtypes():
    shapes = [(1000, 10)] * 4
    psi = 40_000
    ddp = comm.ddp_step(shapes, 4)
    fsdp = comm.fsdp2_step([FSDPGroup.of([torch.empty(s)]) for s in shapes], 4)
    assert sum(map(comm.zero_volume, ddp)) == 2 * psi
    assert sum(map(comm.zero_volume, fsdp)) == 3 * psi
    bf16 = comm.fsdp2_step([FSDPGroup.of([torch.empty(s)]) for s in shapes], 4,
                           param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # bf16 all-gathers + an fp32 reduce-scatter move the bytes of one fp32 all-reduce
    assert sum(c.bytes for c in bf16) == sum(c.bytes * 2 for c in ddp)
    assert {c.dtype for c in bf16 if c.kind == "all_gather"} == {"bfloat16"}


def test_zero1_is_ddp_plus_one_broadcast_per_parameter():
    step = comm.zero1_step([(3, 4), (5,)], 2)
    assert [c.kind for c in step] == ["all_reduce", "broadcast", "broadcast"]
    assert sum(c.numel for c in step if c.kind == "broadcast") == 17


def test_ring_and_gloo_bytes():
    ag = Collective("all_gather", "float32", 100, 400, None, 4)
    rs = Collective("reduce_scatter", "float32", 100, 400, None, 4)
    ar = Collective("all_reduce", "float32", 100, 400, None, 4)
    assert comm.ring_bytes(ag) == comm.ring_bytes(rs) == 300
    assert comm.ring_bytes(ar) == 600
    assert comm.gloo_bytes(rs) == 600  # gloo: reduce-scatter runs as a full all-reduce
    assert comm.gloo_bytes(ag) == 300
    assert comm.ring_bytes(ar, world_size=2) == 400


def test_lower_bound_and_compute_seconds():
    link = comm.Link("test", 100.0, 2)
    step = [Collective("all_reduce", "float32", 50, 200, None, 2)]
    assert comm.lower_bound_seconds(step, link) == pytest.approx(2.0)  # 2 * 1/2 * 200 B / 100 B/s
    assert comm.compute_seconds(10, 5, 300, 0.5) == pytest.approx(2.0)


@pytest.mark.parametrize("call", [
    lambda: comm.fsdp2_padded_numel((4,), 0),
    lambda: comm.ddp_step([], 2),
    lambda: comm.ddp_step(["x"], 2),
    lambda: comm.fsdp2_step([], 2),
    lambda: comm.fsdp2_step([((4,),)], 2),
    lambda: comm.fsdp2_groups(torch.nn.Linear(2, 2)),
    lambda: comm.Link("x", 0, 2),
    lambda: comm.compute_seconds(1, 1, 1, 1.5),
    lambda: comm.summarize([], steps=0),
    lambda: CollectiveLog("model"),
    lambda: CollectiveLog().count("allreduce"),
    lambda: comm.count_ddp_allreduce(torch.nn.Linear(2, 2)),
])
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()


# -- the counter, in one process (a gloo world of one) -------------------------------------------------

@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_log_records_kind_dtype_bytes_and_phase(world_of_one):
    originals = {name: getattr(dist, name) for name in ("all_reduce", "broadcast", "all_gather_single")}
    model = torch.nn.Linear(3, 3)
    model.register_forward_hook(lambda m, i, o: dist.broadcast(torch.zeros(7), src=0))
    with CollectiveLog(model) as log:
        dist.all_reduce(torch.zeros(10, dtype=torch.bfloat16))
        with log.phase("custom"):
            dist.all_gather_single(torch.zeros(6), torch.zeros(6))
        model(torch.zeros(1, 3))
    assert log.records == [
        Collective("all_reduce", "bfloat16", 10, 20, None, 1),
        Collective("all_gather", "float32", 6, 24, "custom", 1),
        Collective("broadcast", "float32", 7, 28, "forward", 1),
    ]
    assert (log.count(), log.count("all_reduce"), log.bytes(), log.elements("broadcast")) == (3, 1, 72, 7)
    dist.all_reduce(torch.zeros(3))  # after exit: not recorded, and the originals are back
    assert log.count() == 3
    assert all(getattr(dist, name) is fn for name, fn in originals.items())


def test_log_restores_wrappers_after_an_exception(world_of_one):
    original = dist.all_reduce
    with pytest.raises(RuntimeError, match="boom"):
        with CollectiveLog():
            raise RuntimeError("boom")
    assert dist.all_reduce is original
    with CollectiveLog() as log:  # and a new log can open
        dist.all_reduce(torch.zeros(1))
    assert log.count("all_reduce") == 1


def test_logs_do_not_nest(world_of_one):
    with CollectiveLog():
        with pytest.raises(ValueError, match="already active"):
            CollectiveLog().__enter__()


# -- the counter on 2 ranks: DDP needs the hook, FSDP2 matches the model exactly ------------------------

def _ddp_worker(rank: guide.Rank, hook: bool) -> tuple[list[Collective], int | None]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from guide.data import synthetic_batches
    from guide.model import ModelConfig, build_model
    from guide.training import make_optimizer, train_steps

    cfg = ModelConfig(n_layers=1)
    batches = synthetic_batches(steps=3, batch_size=4, seq_len=8, vocab=cfg.vocab)
    model = DDP(build_model(cfg))
    opt = make_optimizer("sgd", model.parameters())
    if hook:
        comm.count_ddp_allreduce(model)
    train_steps(model, opt, batches[:1], rank.rank, rank.world_size)
    with CollectiveLog(model if hook else None) as log:
        train_steps(model, opt, batches[1:], rank.rank, rank.world_size)
    return log.records, log.wire_bytes


def _fsdp_worker(rank: guide.Rank) -> tuple[list[Collective], list[FSDPGroup], int | None]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from guide.data import synthetic_batches
    from guide.model import ModelConfig, build_model
    from guide.sharding import apply_fsdp2
    from guide.training import make_optimizer, train_steps

    cfg = ModelConfig(vocab=127, n_layers=2)  # 127 rows: the embedding and head are padded
    batches = synthetic_batches(steps=2, batch_size=4, seq_len=8, vocab=cfg.vocab)
    model = build_model(cfg)
    groups = comm.fsdp2_groups(model)  # fully_shard's default: blocks reshard, the root does not
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    apply_fsdp2(model, init_device_mesh("cpu", (rank.world_size,)), mp_policy=mp)
    opt = make_optimizer("sgd", model.parameters())
    train_steps(model, opt, batches[:1], rank.rank, rank.world_size)
    with CollectiveLog(model) as log:
        train_steps(model, opt, batches[1:], rank.rank, rank.world_size)
    return log.records, groups, log.wire_bytes


def test_ddp_allreduce_is_counted_only_with_the_hook():
    from guide.model import ModelConfig, build_model

    psi = sum(p.numel() for p in build_model(ModelConfig(n_layers=1)).parameters())
    with_hook = guide.launch(_ddp_worker, 2, True)
    records, wire = with_hook[0]
    assert {c.kind for c in records} == {"all_reduce"}
    assert sum(c.numel for c in records) == 2 * psi  # two steps, all gradients each
    assert all(c.phase == "backward" for c in records)
    # the wire counter agrees with the ring model to within WIRE_TOL (gloo headers, control traffic)
    assert wire == pytest.approx(sum(comm.gloo_bytes(c) for c in records), rel=comm.WIRE_TOL)
    # the fault: without the hook, DDP's C++ reducer all-reduces out of Python's sight
    records, wire = guide.launch(_ddp_worker, 2, False)[0]
    assert records == []
    assert wire > psi * 4  # ... though the bytes still went over the wire


@pytest.fixture(scope="module")
def fsdp2_run():
    """Rank 0's records, the fully_shard groups, and both ranks' wire bytes, for one counted step."""
    results = guide.launch(_fsdp_worker, 2)
    records, groups, _ = results[0]
    return records, groups, [w for *_, w in results]


def test_fsdp2_collectives_match_the_model_exactly(fsdp2_run):
    records, groups, _ = fsdp2_run
    expected = comm.fsdp2_step(groups, 2, torch.bfloat16, torch.float32)
    # the same calls (FSDP2 prefetches the next backward all-gather before the current
    # reduce-scatter, so the order differs from the model's listing; the multiset does not)
    assert sorted((c.kind, c.dtype, c.numel, c.phase) for c in records) == \
        sorted((c.kind, c.dtype, c.numel, c.phase) for c in expected)
    padded = sum(c.numel for c in expected if c.kind == "reduce_scatter")
    unpadded = sum(math.prod(s) for g in groups for s in g.shapes)
    assert padded - unpadded == 2 * 64  # one padding row each for tok_emb and head
    comm.check_volume("fsdp2", records, expected, steps=1)


def test_check_volume_catches_a_wrong_model(fsdp2_run):
    records, groups, _ = fsdp2_run
    wrong = {
        "fp32 all-gathers": comm.fsdp2_step(groups, 2),
        "no backward all-gather": comm.fsdp2_step(
            [FSDPGroup(g.shapes, False) for g in groups], 2, torch.bfloat16, torch.float32),
        "DDP": comm.ddp_step([s for g in groups for s in g.shapes], 2),
    }
    for name, model in wrong.items():
        with pytest.raises(checks.CheckFailed, match=r"\[comm (volume|calls)\] run-x"):
            comm.check_volume("run-x", records, model, steps=1)


def test_check_volume_needs_the_padding():
    shapes = [(3,), (5,)]  # at 4 ranks: padded to 4 + 8 = 12 elements, 8 without padding
    measured = comm.fsdp2_step([FSDPGroup(tuple(shapes))], 4)
    unpadded = [dataclasses.replace(c, numel=8, bytes=32) for c in measured]
    comm.check_volume("padded", measured, measured, steps=1)
    with pytest.raises(checks.CheckFailed, match="all_gather in float32 moved 24 elements per step, the model says 16"):
        comm.check_volume("padded", measured, unpadded, steps=1)


def test_wire_bytes_show_gloo_runs_reduce_scatter_as_all_reduce(fsdp2_run):
    records, groups, wire = fsdp2_run
    step = comm.fsdp2_step(groups, 2, torch.bfloat16, torch.float32)
    comm.check_wire("fsdp2", wire, sum(comm.gloo_bytes(c) for c in step), steps=1)
    # the ring model (a native reduce-scatter) is what gloo does *not* do: the check must say so
    with pytest.raises(checks.CheckFailed, match=r"\[comm wire\] fsdp2: rank 0"):
        comm.check_wire("fsdp2", wire, sum(comm.ring_bytes(c) for c in step), steps=1)
