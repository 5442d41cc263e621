"""guide.comm.log: the collective counter sees what DDP, FSDP2 and ZeRO-1 issue, and what it sees
matches guide.comm.expected (checked with guide.checks.check_volume / check_wire).

The launched tests run 2 gloo ranks (a few seconds each); the rest run in a gloo world of one.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.nn.parallel import DistributedDataParallel as DDP

import guide
from guide import checks, comm
from guide.comm import Collective, CollectiveLog, FSDPGroup
from guide.data import synthetic_batches
from guide.launcher.torch_support import flat_collective_name
from guide.model import ModelConfig, build_model
from guide.sharding import apply_fsdp2
from guide.training import make_optimizer, train_steps


@pytest.mark.parametrize("call", [
    lambda: CollectiveLog("model"),
    lambda: CollectiveLog().count("allreduce"),
    lambda: comm.count_ddp_allreduce(torch.nn.Linear(2, 2)),
])
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()


# -- in one process (a gloo world of one) ----------------------------------------------------------

@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_log_records_kind_dtype_bytes_and_phase(world_of_one):
    all_gather = flat_collective_name("all_gather")
    originals = {name: getattr(dist, name) for name in ("all_reduce", "broadcast", all_gather)}
    model = torch.nn.Linear(3, 3)
    model.register_forward_hook(lambda m, i, o: dist.broadcast(torch.zeros(7), src=0))
    with CollectiveLog(model) as log:
        dist.all_reduce(torch.zeros(10, dtype=torch.bfloat16))
        with log.phase("custom"):
            getattr(dist, all_gather)(torch.zeros(6), torch.zeros(6))
        model(torch.zeros(1, 3))
    assert log.records == [
        Collective("all_reduce", "bfloat16", 10, 20, None, 1),
        Collective("all_gather", "float32", 6, 24, "custom", 1),
        Collective("broadcast", "float32", 7, 28, "forward", 1),
    ]
    assert (log.count(), log.count("all_reduce"), log.bytes(), log.elements("broadcast")) == (3, 1, 72, 7)
    assert log.summary()[("all_gather", "float32")] == {"calls": 1, "numel": 6, "bytes": 24}
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


# -- on 2 ranks: DDP needs the hook, FSDP2 matches the model exactly --------------------------------

def _ddp_worker(rank: guide.Rank, hook: bool) -> tuple[list[Collective], int | None]:
    cfg = ModelConfig(n_layers=1)
    batches = synthetic_batches(steps=3, batch_size=4, seq_len=8, vocab=cfg.vocab)
    model = DDP(build_model(cfg))
    opt = make_optimizer("sgd", model.parameters())
    if hook:
        comm.count_ddp_allreduce(model)
    train_steps(model, opt, batches[:1], rank)
    with CollectiveLog(model if hook else None) as log:
        train_steps(model, opt, batches[1:], rank)
    return log.records, log.wire_bytes


def _fsdp_worker(rank: guide.Rank) -> tuple[list[Collective], list[FSDPGroup], int | None]:
    cfg = ModelConfig(vocab=127, n_layers=2)  # 127 rows: the embedding and head are padded
    batches = synthetic_batches(steps=2, batch_size=4, seq_len=8, vocab=cfg.vocab)
    model = build_model(cfg)
    groups = comm.fsdp2_groups(model)  # fully_shard's default: blocks reshard, the root does not
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    apply_fsdp2(model, init_device_mesh("cpu", (rank.world_size,)), mp_policy=mp)
    opt = make_optimizer("sgd", model.parameters())
    train_steps(model, opt, batches[:1], rank)
    with CollectiveLog(model) as log:
        train_steps(model, opt, batches[1:], rank)
    return log.records, groups, log.wire_bytes


def test_ddp_allreduce_is_counted_only_with_the_hook():
    psi = sum(p.numel() for p in build_model(ModelConfig(n_layers=1)).parameters())
    records, wire = guide.launch(_ddp_worker, 2, True)[0]
    assert {c.kind for c in records} == {"all_reduce"}
    assert sum(c.numel for c in records) == 2 * psi  # two steps, all gradients each
    assert all(c.phase == "backward" for c in records)
    # the wire counter agrees with the ring model to within WIRE_TOL (gloo headers, control traffic)
    assert wire == pytest.approx(sum(comm.gloo_bytes(c) for c in records), rel=checks.WIRE_TOL)
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
    checks.check_volume("fsdp2", records, expected, steps=1)


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
            checks.check_volume("run-x", records, model, steps=1)


def test_wire_bytes_show_gloo_runs_reduce_scatter_as_all_reduce(fsdp2_run):
    records, groups, wire = fsdp2_run
    step = comm.fsdp2_step(groups, 2, torch.bfloat16, torch.float32)
    checks.check_wire("fsdp2", wire, sum(comm.gloo_bytes(c) for c in step), steps=1)
    # the ring model (a native reduce-scatter) is what gloo does *not* do: the check must say so
    with pytest.raises(checks.CheckFailed, match=r"\[comm wire\] fsdp2: rank 0"):
        checks.check_wire("fsdp2", wire, sum(comm.ring_bytes(c) for c in step), steps=1)


def _list_all_gather(rank: guide.Rank) -> list[Collective]:
    with CollectiveLog() as log:
        out = [torch.zeros(5) for _ in range(rank.world_size)]
        dist.all_gather(out, torch.full((5,), float(rank.rank)))
    assert [t[0].item() for t in out] == list(range(rank.world_size))
    return log.records


def test_list_form_all_gather_counts_the_gathered_elements():
    """``dist.all_gather(list, t)`` moves world_size × t.numel() elements, like the tensor form."""
    records = guide.launch(_list_all_gather, 2)[0]
    assert records == [Collective("all_gather", "float32", 10, 40, None, 2)]
