"""The experts-on-their-own-mesh page (``examples/plot_experts_mesh.py``) and :mod:`guide.experts`.

:mod:`guide.experts` is held to independent arithmetic: the MoE layer to a per-token loop over
the chosen experts, the expected layout to ``torch.chunk`` itself, expert parallelism on 2 gloo
ranks to the single-process layer (outputs and gradients). The page runs once in this process and
must show torch's own words; two faults injected into its tagged fault points (the experts' divide
factor dropped, the EP all-reduce of the clip dropped) must fail it by the check's name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import EXAMPLES
from faults import assert_fails_by_name

import guide
from guide.experts import (Experts, MoE, all_to_all, build_moe_model, expected_expert_layout,
                           expert_slice, merge_expert_states, to_expert_parallel)
from guide.model import ModelConfig

PAGE = EXAMPLES / "plot_experts_mesh.py"
CFG = ModelConfig(vocab=32, d_model=16, n_layers=1, n_heads=4, d_mlp=32, max_seq=8)


# -- guide.experts, one process ------------------------------------------------------------------

def _moe(n_experts: int = 4, top_k: int = 2) -> MoE:
    torch.manual_seed(0)
    return MoE(CFG.d_model, CFG.d_mlp, n_experts, top_k)


def test_moe_is_the_per_token_sum_over_its_chosen_experts() -> None:
    moe = _moe()
    x = torch.randn(2, 5, CFG.d_model)
    want = torch.zeros_like(x).view(-1, CFG.d_model)
    with torch.no_grad():
        for t, row in enumerate(x.view(-1, CFG.d_model)):
            p = moe.router(row).softmax(-1)
            w, idx = p.topk(2)
            for weight, e in zip(w / w.sum(), idx):
                want[t] += weight * (F.gelu(row @ moe.experts.w1[e]) @ moe.experts.w2[e])
        got = moe(x)
    torch.testing.assert_close(got, want.view_as(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,dim,n", [((3, 32, 64), 1, 2), ((3, 32, 64), 0, 2),
                                         ((5, 8, 4), 0, 4), ((2, 9, 4), 1, 3)])
def test_expected_expert_layout_is_torch_chunk(shape: tuple, dim: int, n: int) -> None:
    chunks = torch.empty(shape).chunk(n, dim=dim)
    for rank in range(n):
        placements, local = expected_expert_layout(shape, dim, rank, n)
        assert placements == f"(Shard(dim={dim}),)"
        want = tuple(chunks[rank].shape) if rank < len(chunks) else (
            *shape[:dim], 0, *shape[dim + 1:])
        assert local == want


def test_bad_arguments_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="not a dimension"):
        expected_expert_layout((3, 4), 2, 0, 2)
    with pytest.raises(ValueError, match="do not split evenly"):
        expert_slice(7, 0, 2)
    with pytest.raises(ValueError, match="not in 0..1"):
        expert_slice(6, 2, 2)
    with pytest.raises(ValueError, match="do not cover"):
        all_to_all(torch.zeros(3, 2), [1, 2], [1, 1], None)
    with pytest.raises(ValueError, match="top_k=3"):
        MoE(4, 8, 2, 3)
    with pytest.raises(ValueError, match="3 counts for 4 experts"):
        _moe().experts(torch.zeros(3, CFG.d_model), [1, 1, 1])
    with pytest.raises(ValueError, match="sdpa"):
        build_moe_model(ModelConfig(attention="explicit"), 4, 1)
    assert expert_slice(6, 1, 2) == slice(3, 6)


def test_each_guard_refuses_on_its_own() -> None:
    """The guards the test above reaches through another one, each alone: a bad count of experts
    or EP ranks by name, a negative EP rank, top_k of 0, splits of different lengths whose sums
    cover ``x``."""
    with pytest.raises(ValueError, match="n must be a positive integer .the number of experts"):
        Experts(0, 4, 8)
    with pytest.raises(ValueError, match="ep_size must be a positive integer"):
        expert_slice(6, 0, 0)
    with pytest.raises(ValueError, match="not in 0..1"):
        expert_slice(6, -1, 2)
    with pytest.raises(ValueError, match="top_k=0"):
        MoE(4, 8, 2, 0)
    with pytest.raises(ValueError, match="differ in length"):
        all_to_all(torch.zeros(3, 2), [3], [1, 2], None)
    assert MoE(4, 8, 2, 2).top_k == 2 and expert_slice(6, 0, 1) == slice(0, 6)


def test_merge_puts_the_experts_back_in_ep_order() -> None:
    a = {"w": torch.zeros(2, 3), "b": torch.ones(2)}
    b = {"w": torch.ones(1, 3), "b": torch.ones(2)}
    merged = merge_expert_states([a, b], {"w"})
    assert torch.equal(merged["w"], torch.cat([a["w"], b["w"]])) and merged["b"] is a["b"]
    with pytest.raises(ValueError, match="different parameters"):
        merge_expert_states([a, {"w": b["w"]}], {"w"})
    with pytest.raises(ValueError, match="different parameters"):
        merge_expert_states([a, b], {"missing"})
    with pytest.raises(ValueError, match="no states"):
        merge_expert_states([], {"w"})


# -- guide.experts, 2 gloo ranks -----------------------------------------------------------------

def _ep_job(rank: guide.Rank) -> dict:
    import torch.distributed as dist

    model = build_moe_model(CFG, 4, 2)
    to_expert_parallel(model, dist.group.WORLD, rank.rank, 2)
    tokens = torch.randint(0, CFG.vocab, (4, 8), generator=torch.Generator().manual_seed(0))
    mine = tokens.chunk(2)[rank.rank]
    out = model(mine)
    (out.square().mean() * 0.5).backward()  # the global mean: half of each rank's
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for n, g in grads.items():  # dense gradients: summed over the ranks (what FSDP2 does)
        if ".experts." not in n:
            dist.all_reduce(g)
    return {"out": out.detach(), "grads": grads}


def test_expert_parallel_computes_the_single_process_layer() -> None:
    """Each rank keeps 2 of 4 experts and routes by all-to-all: outputs, dense gradients and each
    rank's expert gradients equal one process's."""
    ranks = guide.launch(_ep_job, 2)
    model = build_moe_model(CFG, 4, 2)
    tokens = torch.randint(0, CFG.vocab, (4, 8), generator=torch.Generator().manual_seed(0))
    out = model(tokens)
    out.square().mean().backward()
    torch.testing.assert_close(torch.cat([r["out"] for r in ranks]), out.detach(),
                               rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        if ".experts." in name:
            got = torch.cat([r["grads"][name] for r in ranks])
        else:
            got = ranks[0]["grads"][name]
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-6, msg=name)


# -- the page --------------------------------------------------------------------------------------

#: What torch's clip_grad_norm_ says across the two meshes: the stack strategy's ValueError
#: (``torch/distributed/tensor/_ops/_tensor_ops.py``), which torch 2.13's DTensor dispatch wraps in
#: a RuntimeError. The sentence is torch 2.13's, and the same in older and newer releases'
#: sources; the DeviceMesh repr in it changes between releases (2.13: ``DeviceMesh((dp=2), 'cpu',
#: stride=(2,))``), and so may the exception's type: the pattern pins the sentence alone.
TORCH_WORDS = re.compile(r"(RuntimeError|ValueError): All operands in aten\.stack\.default "
                         r"must have the same mesh, but got "
                         r"DeviceMesh\(.+\) and DeviceMesh\(.+\)\."
                         # torch 2.9, the floor: the sharding propagation's failure, cut at 200
                         r"|RuntimeError: Sharding propagation failed for Op\(op=aten\.stack\."
                         r"default, args_schema=\[DTensorSpec\(mesh=DeviceMesh.+ \.\.\.")


def test_page_prints_torchs_words(page: dict) -> None:
    """torch's words, the first line as it says it, so a search for them lands here."""
    printed = page["OUTPUT"].split("clip_grad_norm_(model.parameters(), 0.5):\n  ", 1)[1]
    assert TORCH_WORDS.fullmatch(printed.splitlines()[0]), printed.splitlines()[0]


@pytest.mark.parametrize("line,ok", [
    ("RuntimeError: All operands in aten.stack.default must have the same mesh, but got "
     "DeviceMesh((dp=2), 'cpu', stride=(2,)) and DeviceMesh((4,), 'cpu', stride=(1,)).", True),
    ("ValueError: All operands in aten.stack.default must have the same mesh, but got "
     "DeviceMesh('cpu', [0, 2], mesh_dim_names=('dp',)) and DeviceMesh('cpu', [0, 1, 2, 3]).",
     True),
    ("RuntimeError: Cannot run aten.stack.default on inputs with different meshes", False),
    ("RuntimeError: All operands in aten.cat.default must have the same mesh, but got "
     "DeviceMesh((2,)) and DeviceMesh((4,)).", False)])
def test_torchs_words_are_matched_across_releases(line: str, ok: bool) -> None:
    """The pattern accepts the 2.13 line verbatim and the older repr, and nothing else."""
    assert bool(TORCH_WORDS.fullmatch(line)) is ok


_SPEC = ("DTensorSpec(mesh=DeviceMesh({mesh}, device: 'cpu', stride: (1,)), placements=("
         "_NormPartial(reduce_op='sum', norm_type=2.0),), tensor_meta=TensorMeta(shape="
         "torch.Size([]), stride=(), dtype=torch.float32))")
TORCH_2_9 = ("RuntimeError: Sharding propagation failed for Op(op=aten.stack.default, "
             "args_schema=[{}] @ mesh: None)")


@pytest.mark.parametrize("message,ok", [
    # torch 2.13 and newer: the stack strategy's sentence
    ("RuntimeError: All operands in aten.stack.default must have the same mesh, but got "
     "DeviceMesh((dp=2), 'cpu', stride=(2,)) and DeviceMesh((4,), 'cpu', stride=(1,)).", True),
    # torch 2.9 (CI's compat lane): operands on two meshes
    (TORCH_2_9.format(", ".join([_SPEC.format(mesh="(4,)"), _SPEC.format(mesh="(dp=2)")])),
     True),
    # the same failure with every operand on one mesh is another bug, not the mismatch
    (TORCH_2_9.format(", ".join([_SPEC.format(mesh="(4,)")] * 3)), False),
    ("RuntimeError: Sharding propagation failed for Op(op=aten.cat.default, args_schema=[" +
     _SPEC.format(mesh="(4,)") + ", " + _SPEC.format(mesh="(dp=2)") + "] @ mesh: None)", False),
    ("RuntimeError: All operands in aten.cat.default must have the same mesh", False),
    (None, False), ("", False)])
def test_the_mesh_mismatch_is_recognised_in_each_torchs_words(message, ok) -> None:
    from guide.experts import mesh_mismatch

    assert mesh_mismatch(message) is ok


def test_the_placement_check_sees_the_default_shard0(page: dict) -> None:
    """The layout check is not vacuous: Shard(0) experts (the default) fail the Shard(1) formula,
    and the Shard(0) shapes are uneven (two local experts on one rank, one on the other)."""
    result = page["RESULT"]
    expected, shapes = result["expected"], result["shapes"]
    wrong = {lay.name for i, r in enumerate(result["results"]) for lay in r["default_layouts"]
             if (lay.placements, lay.local_shape)
             != expected(lay.name, shapes.get_parameter(lay.name), r, i, 1)[:2]}
    assert wrong == result["EXPERT_NAMES"]
    rows = {r["dp_rank"]: lay.local_shape[0] for r in result["results"]
            for lay in r["default_layouts"] if lay.name == "blocks.0.moe.experts.w1"}
    assert rows == {0: 2, 1: 1}


def test_the_per_mesh_norm_misses_the_other_experts(page: dict) -> None:
    """One norm per mesh is smaller than the true norm, and differs between the EP ranks."""
    results = page["RESULT"]["results"]
    naive = [r["clipped"]["naive"][0] for r in results]
    true = page["RESULT"]["clip_norms"][0]
    assert all(n < true - 1e-3 for n in naive) and abs(naive[0] - naive[1]) > 1e-4
    fault, fixed = (results[0][k][1] for k in ("fault", "fixed"))
    assert fault == pytest.approx(2 * fixed, rel=1e-5)


def test_one_group_places_as_two_groups_where_torch_has_it(page: dict) -> None:
    """torch 2.13's ShardPlacementResult: one fully_shard per block gives section 1's layout."""
    if page["RESULT"]["ShardPlacementResult"] is None:
        assert "section 5 needs torch 2.13" in page["OUTPUT"]
        return
    for r in page["RESULT"]["results"]:
        assert r["one_group"]["meshes"] == r["meshes"]
        assert [(x.name, x.placements, x.local_shape) for x in r["one_group"]["layouts"]] == [
            (x.name, x.placements, x.local_shape) for x in r["layouts"]]


#: Faults injected into the page's tagged fault points (tests/faults.py): (tag, replacement).
FAULTS = {
    # the experts' set_gradient_divide_factor(world size) left out: their gradients come out EP
    # times too large
    "no_divide_factor": [("divide-factor", "")],
    # clip_across_meshes without the all-reduce over the EP group: the other EP ranks' experts
    # are missing from the norm
    "clip_without_ep_all_reduce": [("ep-all-reduce", "")],
}
#: fault -> the check that must fail the page
EXPECTED = {
    "no_divide_factor": r"\[(loss|parameter) equivalence\] FSDP2 \+ EP, sgd",
    "clip_without_ep_all_reduce": r"\[clip norm\] rank 0",
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_injected_fault_fails_the_page_by_name(fault: str, tmp_path: Path) -> None:
    assert_fails_by_name(PAGE, fault, FAULTS[fault], EXPECTED[fault], tmp_path, timeout=300)
