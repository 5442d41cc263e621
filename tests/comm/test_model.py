"""guide.comm.expected: one step's collectives from parameter shapes, and the checks that compare
them.

Pure arithmetic; the comparison with what real ranks issue is in ``test_log.py``.
"""

from __future__ import annotations

import pytest
import torch

from guide import comm
from guide.comm import Collective, FSDPGroup
from guide.model import ModelConfig, build_model
from guide.sharding import fsdp2_units


def test_padded_numel_follows_torch_chunk():
    assert comm.fsdp2_padded_numel((127, 64), 2) == 128 * 64
    assert comm.fsdp2_padded_numel((64,), 3) == 66
    assert comm.fsdp2_padded_numel((128, 64), 2) == 128 * 64
    assert comm.fsdp2_padded_numel((5,), 4) == 8  # chunks of 2, 2, 1, 0: each padded to 2
    assert comm.fsdp2_padded_numel((), 2) == 2  # a scalar is one row
    assert comm.fsdp2_padded_numel((0, 3), 2) == 0


def test_fsdp2_step_counts_calls_per_group():
    groups = [FSDPGroup(((8, 4),), True), FSDPGroup(((8, 4),), True), FSDPGroup(((16,),), False)]
    step = comm.fsdp2_step(groups, 2)
    kinds = [(c.kind, c.phase) for c in step]
    assert kinds.count(("all_gather", "forward")) == 3
    assert kinds.count(("all_gather", "backward")) == 2  # the non-resharding group keeps its params
    assert kinds.count(("reduce_scatter", "backward")) == 3


def test_fsdp2_groups_are_the_sharding_units_with_fully_shards_default():
    model = build_model(ModelConfig(n_layers=3))
    units = fsdp2_units(model)
    default = comm.fsdp2_groups(model)
    assert [g.shapes for g in default] == [tuple(tuple(p.shape) for p in u) for u in units]
    # the default keeps the root (first) unsharded until backward, reshards every block
    assert [g.reshard_after_forward for g in default] == [False, True, True, True]
    assert {g.reshard_after_forward for g in comm.fsdp2_groups(model, False)} == {False}
    # units given as shapes (an Architecture's) give the same groups as the model's parameters
    shapes = [[tuple(p.shape) for p in u] for u in units]
    assert comm.fsdp2_unit_groups(shapes) == default


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
    assert sum(map(comm.zero_bytes, bf16)) == sum(map(comm.zero_bytes, ddp))
    assert {c.dtype for c in bf16 if c.kind == "all_gather"} == {"bfloat16"}


def test_zero1_is_ddp_plus_one_broadcast_per_parameter():
    step = comm.zero1_step([(3, 4), (5,)], 2)
    assert [c.kind for c in step] == ["all_reduce", "broadcast", "broadcast"]
    assert sum(c.numel for c in step if c.kind == "broadcast") == 17


def test_hsdp_is_fsdp2_in_the_shard_group_plus_an_all_reduce_of_each_shard():
    groups = [FSDPGroup(((7, 4),), False), FSDPGroup(((8, 4),), True)]
    step = comm.hsdp_step(groups, shard_size=2, replicas=3)
    assert step[:len(comm.fsdp2_step(groups, 2))] == comm.fsdp2_step(groups, 2)
    reduces = [c for c in step if c.kind == "all_reduce"]
    # one per unit, of this rank's padded shard (8 rows / 2 and 8 rows / 2, 4 columns), over 3 ranks
    assert [(c.numel, c.group_size) for c in reduces] == [(16, 3), (16, 3)]
    assert comm.hsdp_step(groups, 2, 1) == comm.fsdp2_step(groups, 2)  # one replica: plain FSDP2


def test_summarize_groups_by_kind_and_dtype_per_step():
    step = comm.fsdp2_step([FSDPGroup(((4,),))], 2, torch.bfloat16, torch.float32)
    two = comm.summarize(step * 2, steps=2)
    assert two == {("all_gather", "bfloat16"): {"calls": 2, "numel": 8, "bytes": 16},
                   ("reduce_scatter", "float32"): {"calls": 1, "numel": 4, "bytes": 16}}


@pytest.mark.parametrize("call", [
    lambda: comm.fsdp2_padded_numel((4,), 0),
    lambda: comm.ddp_step([], 2),
    lambda: comm.ddp_step(["x"], 2),
    lambda: comm.ddp_step([(2,)], True),
    lambda: comm.fsdp2_step([], 2),
    lambda: comm.fsdp2_step([((4,),)], 2),
    lambda: comm.fsdp2_groups(torch.nn.Linear(2, 2)),
    lambda: comm.fsdp2_unit_groups([]),
    lambda: comm.hsdp_step([FSDPGroup(((4,),))], 2, 0),
    lambda: comm.summarize([], steps=0),
    lambda: comm.collective("allreduce", torch.float32, 1, None, 2),
])
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()
