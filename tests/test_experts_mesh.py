"""The experts-on-their-own-mesh page (``examples/plot_experts_mesh.py``) and :mod:`guide.experts`.

:mod:`guide.experts` is held to independent arithmetic: the MoE layer to a per-token loop over
the chosen experts, the expected layout to ``torch.chunk`` itself, expert parallelism on 2 gloo
ranks to the single-process layer (outputs and gradients). The page runs once in this process and
must show torch's own words; two faults injected into its tagged fault points (the experts' divide
factor dropped, the EP all-reduce of the clip dropped) must fail it by the check's name.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import EXAMPLES
from faults import assert_fails_by_name
from peers import IMPORT_LIMIT_S, rank0_beside_peer

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


def test_the_refusals_say_the_whole_reason() -> None:
    """Each message in full: the argument, its value and what it should be."""
    with pytest.raises(ValueError) as err:
        expert_slice(6, 0, 0)
    assert str(err.value) == ("ep_size must be a positive integer (the expert-parallel degree), "
                              "got 0.")
    with pytest.raises(ValueError) as err:
        all_to_all(torch.zeros(3, 5), [1, 2], [1, 1], None)
    assert str(err.value) == ("splits [1, 1] do not cover the 3 rows of x, or differ in length "
                              "from [1, 2].")
    with pytest.raises(ValueError) as err:
        merge_expert_states([{"w": torch.ones(1)}, {}], {"w"})
    assert str(err.value) == "the EP ranks' states name different parameters."
    with pytest.raises(ValueError) as err:
        merge_expert_states([], {"w"})
    assert str(err.value) == "no states to merge."


def test_expert_slice_is_a_slice_of_ints() -> None:
    """The slice indexes a list (a slice of floats 3.0:6.0 would not)."""
    assert list(range(6))[expert_slice(6, 1, 2)] == [3, 4, 5]
    assert list(range(6))[expert_slice(6, 0, 3)] == [0, 1]


def test_merge_takes_a_state_of_experts_alone() -> None:
    """Every parameter may be an expert one (the names equal the states' keys)."""
    merged = merge_expert_states([{"w": torch.zeros(1, 2)}, {"w": torch.ones(2, 2)}], {"w"})
    assert merged["w"].tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]


def test_a_fresh_moe_is_one_process_layer_and_top_k_1_is_allowed() -> None:
    moe = MoE(4, 8, 2, 1)
    assert (moe.top_k, moe.ep_group, moe.ep_size) == (1, None, 1)
    assert moe.router.bias is None


def test_experts_no_token_chooses_still_count() -> None:
    """Every token picks expert 0 (positive inputs, the router's other rows 0): the counts still
    name all 4 experts, 3 of them with no rows."""
    moe = _moe(4, 1)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 1.0
    x = torch.rand(3, CFG.d_model) + 0.1
    with torch.no_grad():
        want = F.gelu(x @ moe.experts.w1[0]) @ moe.experts.w2[0]
        torch.testing.assert_close(moe(x), want, rtol=1e-5, atol=1e-6)


def test_build_moe_model_lands_on_the_device_it_is_given() -> None:
    model = build_moe_model(CFG, 4, 2, device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_building_touches_no_accelerator_rng(monkeypatch) -> None:
    """The build forks the CPU generator only: on a node with GPUs it must not initialise them
    (torch's fork_rng with devices=None reads every CUDA device's state)."""
    def touched(*args, **kwargs):
        raise AssertionError("build_moe_model read a CUDA generator")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state", touched)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fork_rng's warning about "2 available devices" too
        build_moe_model(CFG, 4, 2)


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


#: The uneven all-to-all of the two-rank test: rank -> (in_splits, out_splits). Rank 0 sends 1 row
#: to itself and 3 to rank 1, rank 1 sends 2 to rank 0 and 2 to itself (4 rows out, 3 in).
_SPLITS = {0: ([1, 3], [1, 2]), 1: ([2, 2], [3, 2])}


def _rows(rank: int) -> torch.Tensor:
    """Rank ``rank``'s rows for the all-to-all: row ``i`` is ``100 * rank + i`` plus a [2, 3] of
    tenths, viewed [3, 2] (not contiguous)."""
    n = sum(_SPLITS[rank][0])
    tenths = torch.arange(6.0).view(2, 3) / 10
    base = (100.0 * rank + torch.arange(n, dtype=torch.float32))[:, None, None] + tenths
    return base.transpose(1, 2)


def _weights(rank: int, n: int) -> torch.Tensor:
    """What rank ``rank`` multiplies its ``n`` received rows by in its loss."""
    return ((rank + 1) * torch.arange(1.0, n + 1))[:, None, None].expand(n, 3, 2)


def _two_rank_work(rank: int) -> dict:
    """The same on both ranks of a gloo world of 2 (rank 0 in the test, rank 1 a peer): the
    all-to-all over the world and over a group of one, and MoE layers with their experts over the
    world (2 per rank) and over a group of one (all 4). Returns rank 0's tensors."""
    import torch.distributed as dist

    own = [dist.new_group([0]), dist.new_group([1])][rank]  # every rank creates every group
    got = {}
    in_splits, out_splits = _SPLITS[rank]
    x = _rows(rank).requires_grad_()
    out = all_to_all(x, out_splits, in_splits, dist.group.WORLD)
    (out * _weights(rank, len(out))).sum().backward()
    got["world"], got["world_grad"] = out.detach(), x.grad
    x = _rows(rank).requires_grad_()
    out = all_to_all(x, [len(x)], [len(x)], own)
    (out * _weights(rank, len(out))).sum().backward()
    got["own"], got["own_grad"] = out.detach(), x.grad

    tokens = torch.randint(0, CFG.vocab, (4, 8), generator=torch.Generator().manual_seed(0))
    mine = tokens.chunk(2)[rank]
    for name, group, ep_rank, ep_size in (("ep2", dist.group.WORLD, rank, 2), ("ep1", own, 0, 1)):
        model = to_expert_parallel(build_moe_model(CFG, 4, 2), group, ep_rank, ep_size)
        out = model(mine)
        (out.square().mean() * 0.5).backward()  # over the world: half the global mean
        got[name] = [torch.zeros_like(out), torch.zeros_like(out)]
        dist.all_gather(got[name], out.detach())
        got[name + "_grads"] = {n: p.grad for n, p in model.named_parameters()}
    return got


#: Rank 1 of the two-rank test: _two_rank_work in a fresh process.
_PEER = """
import datetime, sys
import torch.distributed as dist
from test_experts_mesh import _two_rank_work
dist.init_process_group("gloo", init_method=sys.argv[1], rank=1, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
_two_rank_work(1)
dist.destroy_process_group()
"""


def _run_two_ranks(tmp: Path) -> dict:
    """Rank 0's results of :func:`_two_rank_work`, run in this process (where mutmut sees it)."""
    with rank0_beside_peer(_PEER, tmp, timeout_s=60):
        return _two_rank_work(0)


def _reference(tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model = build_moe_model(CFG, 4, 2)
    out = model(tokens)
    out.square().mean().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters()}


def _all_to_all_moves_uneven_splits_and_their_gradients_back(got: dict) -> None:
    """Rank 0 keeps its row 0 and gets rank 1's rows 0-1; each row's gradient is the weight its
    receiver gave it (rank 0's first, rank 1's first three for the rows rank 0 sent it)."""
    x0, x1 = _rows(0), _rows(1)
    assert torch.equal(got["world"], torch.cat([x0[:1], x1[:2]]))
    assert torch.equal(got["world_grad"], torch.cat([_weights(0, 3)[:1], _weights(1, 5)[:3]]))


def _all_to_all_over_a_group_of_one_keeps_the_rows(got: dict) -> None:
    """Over rank 0's group of one (not the world of 2): x itself, and its loss weights as grad."""
    assert torch.equal(got["own"], _rows(0))
    assert torch.equal(got["own_grad"], _weights(0, 4))


def _expert_parallel_computes_the_single_process_layer(got: dict, tokens: torch.Tensor) -> None:
    """EP over the world (rank 0 holds experts 0-1): both ranks' outputs are one process's, and so
    are rank 0's expert gradients (from both ranks' tokens) and dense gradients (its tokens')."""
    want, want_grads = _reference(tokens)
    torch.testing.assert_close(torch.cat(got["ep2"]), want, rtol=1e-5, atol=1e-6)
    _, mine_grads = _reference(tokens[:2])  # the dense gradients of rank 0's half of the loss
    for name, grad in got["ep2_grads"].items():
        if ".experts." in name:
            assert grad.shape[0] == 2, name
            torch.testing.assert_close(grad, want_grads[name][:2], rtol=1e-4, atol=1e-6, msg=name)
        else:
            torch.testing.assert_close(grad, 0.5 * mine_grads[name], rtol=1e-4, atol=1e-6,
                                       msg=name)


def _expert_parallel_over_a_group_of_one_is_the_whole_layer(got: dict,
                                                             tokens: torch.Tensor) -> None:
    """EP of degree 1 over each rank's own group inside the world of 2: every expert kept, each
    rank's outputs and gradients those of one process on its own tokens."""
    for rank, half in enumerate(tokens.chunk(2)):
        want, _ = _reference(half)
        torch.testing.assert_close(got["ep1"][rank], want, rtol=1e-5, atol=1e-6)
    _, want_grads = _reference(tokens[:2])
    for name, grad in got["ep1_grads"].items():
        torch.testing.assert_close(grad, 0.5 * want_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.timeout(IMPORT_LIMIT_S + 180)  # rank 1 imports torch first (tests/peers.py)
def test_two_ranks_here_exchange_and_compute_what_one_process_does(tmp_path: Path) -> None:
    """Rank 0 in this process (mutmut sees only this process), rank 1 a peer: the all-to-all
    over the world and over a group of one, values and gradients, and expert parallelism of
    degree 2 and 1, outputs and gradients against one process (one test: the peer runs once, and
    mutmut attributes the calls to the test that made them)."""
    got = _run_two_ranks(tmp_path)
    tokens = torch.randint(0, CFG.vocab, (4, 8), generator=torch.Generator().manual_seed(0))
    _all_to_all_moves_uneven_splits_and_their_gradients_back(got)
    _all_to_all_over_a_group_of_one_keeps_the_rows(got)
    _expert_parallel_computes_the_single_process_layer(got, tokens)
    _expert_parallel_over_a_group_of_one_is_the_whole_layer(got, tokens)


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
