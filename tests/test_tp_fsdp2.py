"""Tensor parallel + FSDP2: the TP-ready block, the layout and communication models, the estimate.

The distributed test runs TP on a (1, 2) mesh of 2 gloo ranks and shows that the page's checks
catch a plan that leaves the MLP out: placements and tp-group all-reduces both disagree with the
model of the full plan.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import guide
from guide import checks
from guide.comm.tp import MeshLog, tp_fsdp2_step, tp_fsdp_estimate, tp_step
from guide.memory import PRESETS
from guide.memory.activations import block_bytes
from guide.model import Block, ModelConfig
from guide.tensor_parallel import (TPBlock, build_tp_model, expected_layout, plan_kinds,
                                   tp_local_shapes)

CFG = ModelConfig(vocab=32, d_model=16, n_layers=2, n_heads=4, d_mlp=32, max_seq=8)


def plan(mlp: bool = True) -> dict:
    out = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
           "proj": RowwiseParallel()}
    if mlp:
        out |= {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    return out


def test_tp_block_computes_the_sites_block() -> None:
    """TPBlock with q/k/v cut from Block's fused qkv weight gives Block's output, bit for bit."""
    torch.manual_seed(0)
    block, tp_block = Block(CFG), TPBlock(CFG)
    with torch.no_grad():
        for name in ("ln1", "proj", "ln2", "fc1", "fc2"):
            getattr(tp_block, name).load_state_dict(getattr(block, name).state_dict())
        for lin, w in zip((tp_block.q, tp_block.k, tp_block.v), block.qkv.weight.chunk(3)):
            lin.weight.copy_(w)
    x = torch.randn(2, 8, CFG.d_model)
    assert torch.equal(block(x), tp_block(x))


def test_local_shapes_and_layout_follow_the_plan() -> None:
    model = build_tp_model(CFG)
    local = tp_local_shapes(model, plan(), 2)
    assert local["blocks.0.q.weight"] == (8, 16)  # colwise: output rows split
    assert local["blocks.0.fc1.bias"] == (16,)
    assert local["blocks.0.proj.weight"] == (16, 8)  # rowwise: input columns split
    assert local["blocks.0.proj.bias"] == (16,)  # rowwise bias: whole on every TP rank
    assert local["tok_emb.weight"] == (32, 16)  # outside the plan
    layout = expected_layout(model, plan(), dp=2, tp=2, dp_rank=1)
    assert layout["blocks.1.q.weight"] == ("(_StridedShard(dim=0, sf=2), Shard(dim=0))", (4, 16))
    assert layout["blocks.1.fc2.weight"] == ("(Shard(dim=0), Shard(dim=1))", (8, 16))
    assert layout["blocks.1.fc2.bias"] == ("(Shard(dim=0), Replicate())", (8,))
    assert layout["ln_f.weight"] == ("(Shard(dim=0),)", (8,))


def test_bad_plans_are_refused_with_the_fix() -> None:
    model = build_tp_model(CFG)
    with pytest.raises(ValueError, match="not divisible by tp=3"):
        tp_local_shapes(model, plan(), 3)
    with pytest.raises(ValueError, match="not ColwiseParallel or RowwiseParallel"):
        plan_kinds({"q": object()})
    with pytest.raises(ValueError, match="attention='sdpa'"):
        build_tp_model(ModelConfig(attention="explicit"))


def test_tp_step_counts_one_all_reduce_per_split() -> None:
    """Per block: 2 forward (rowwise outputs), 4 backward (q, k, v, fc1 input gradients)."""
    model = build_tp_model(CFG)
    step = tp_step(model, plan_kinds(plan()), tokens=10, tp=2)
    assert [c.phase for c in step].count("forward") == 2 * CFG.n_layers
    assert [c.phase for c in step].count("backward") == 4 * CFG.n_layers
    assert {c.numel for c in step} == {10 * CFG.d_model}
    assert {(c.kind, c.group_size) for c in step} == {("all_reduce", 2)}


def test_estimate_is_the_memory_models_count_and_divides_the_layer() -> None:
    arch = PRESETS["llama-3-8b"]
    alone = tp_fsdp_estimate(arch, 64, 1, 4096)
    t, h = 4096, arch.hidden
    assert alone.activation_bytes == arch.layers * block_bytes(arch, 4096, 1, norm="fused",
                                                               bytes_per_element=2)
    # with TP 8 the two norms (input, output, rstd: 2 * (4h + 4) bytes per token) stay whole
    whole = 2 * t * (4 * h + 4)
    assert tp_fsdp_estimate(arch, 64, 8, 4096).activation_bytes == arch.layers * (
        whole + (alone.activation_bytes // arch.layers - whole) // 8)
    assert alone.tp_all_reduce_bytes == 0 and alone.global_batch == 64
    tp8 = tp_fsdp_estimate(arch, 64, 8, 4096)
    assert tp8.gathered_layer_bytes * 8 == alone.gathered_layer_bytes
    assert tp8.activation_bytes < alone.activation_bytes and tp8.global_batch == 8
    sp = tp_fsdp_estimate(arch, 64, 8, 4096, sequence_parallel=True)
    assert sp.activation_bytes * 8 == alone.activation_bytes
    with pytest.raises(ValueError, match="fit in a node"):
        tp_fsdp_estimate(arch, 64, 16, 4096)


def _tp_job(rank: guide.Rank, mlp: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from guide.layout import param_layouts

    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    model = build_tp_model(CFG)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], plan(mlp))
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    tokens = torch.randint(0, CFG.vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    with MeshLog() as log:
        model(tokens[:, :-1]).sum().backward()
    return {"by_dim": log.by_dim(mesh), "layouts": param_layouts(model, rank.rank)}


def test_checks_catch_an_mlp_left_out_of_the_plan() -> None:
    model = build_tp_model(CFG)
    tp_model = tp_step(model, plan_kinds(plan()), tokens=16, tp=2)
    for mlp in (True, False):
        result = guide.launch(_tp_job, 2, mlp)[0]
        want = expected_layout(model, plan(), 1, 2, 0)
        wrong = [lay.name for lay in result["layouts"]
                 if (lay.placements, lay.local_shape) != want[lay.name]]
        if mlp:
            assert wrong == []
            checks.check_volume("full plan", result["by_dim"]["tp"], tp_model, 1, tol=0.0,
                                exact_calls=("all_reduce",))
        else:
            assert wrong and all(".fc" in name for name in wrong)
            with pytest.raises(checks.CheckFailed, match="all_reduce"):
                checks.check_volume("MLP left out", result["by_dim"]["tp"], tp_model, 1,
                                    tol=0.0, exact_calls=("all_reduce",))


def test_mesh_log_refuses_to_nest() -> None:
    with MeshLog():
        with pytest.raises(ValueError, match="already active"):
            MeshLog().__enter__()
