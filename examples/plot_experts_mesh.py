"""
Experts on their own mesh (MoE): shard_placement_fn, expert parallel and clipping
=================================================================================

.. admonition:: Verdict
   :class: tip

   Shard a mixture-of-experts (MoE) block in two ``fully_shard`` groups: attention, norms and router
   over every rank, the experts over the sub-mesh of the ranks that hold the same experts
   (``mesh["dp"]`` of a ``("dp", "ep")`` mesh), with ``shard_placement_fn`` returning ``Shard(1)``
   for the 3-D expert weights when the local experts do not split evenly over those ranks. Two
   things do not come for free. The experts' gradients summed tokens from the whole EP group:
   divide them by the world size (``set_gradient_divide_factor``), or they come out
   :claim:`experts.fault.grad_ratio` times too large. And ``clip_grad_norm_`` refuses parameters
   on two meshes; combine one norm per mesh, the experts' summed over the EP group, which gives the
   single-process norm to :claim:`experts.clip.norm_gap`. Trained so, FSDP2 + EP matches one
   process to :claim:`experts.train.sgd.max_dloss` in the loss. (torch 2.13 can also put the
   experts on their mesh inside one ``fully_shard`` group: section 5.)
   Measured on CPU gloo processes (a tiny model, two shared cores); nothing is predicted.

A mixture-of-experts block replaces the MLP by a router and ``n_experts`` MLP experts, each token
going to its ``top_k`` best. With expert parallelism (EP) the experts are split over the ``ep``
ranks of a group, and an all-to-all sends each token to the rank that holds its expert and brings
the result back (:class:`guide.experts.MoE`). The ranks with the same ``ep`` coordinate hold the same
experts and see different data: FSDP2 shards the experts over them, the ``"dp"`` dimension of a
``(dp, ep)`` mesh, while everything else is sharded over all ranks, as torchtitan does. This page
runs it on a ``(2, 2)`` mesh of CPU gloo ranks and fails the build unless every parameter sits on
the mesh and in the shape the formula says, training equals one process, and the clip is the
single-process clip.
"""

# %%
# The code to copy
# ----------------
# Two meshes: all ranks, and ``(dp, ep)``; the model's experts are already this EP rank's
# (:func:`guide.experts.to_expert_parallel`). ``expert_dim1`` is the ``shard_placement_fn``: with
# three local experts on each EP rank and two ranks to shard them (the default world), ``Shard(0)``
# would give one rank two experts and the other one; ``Shard(1)`` splits the ``d_in`` dim evenly
# (FSDP2 requires an even split on a nonzero dim).
# ``clip_across_meshes`` is ``clip_grad_norm_`` for the two groups (section 4 shows why).
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard
from torch.nn.utils import clip_grads_with_norm_, get_total_norm


def meshes(world_size: int, ep: int, device_type: str = "cpu"):
    world = init_device_mesh(device_type, (world_size,))
    return world, init_device_mesh(device_type, (world_size // ep, ep), mesh_dim_names=("dp", "ep"))


def expert_dim1(param: torch.nn.Parameter):
    """Expert weights are [experts, d_in, d_out]: shard d_in, not the few experts."""
    return Shard(1) if param.dim() == 3 else None


def shard_moe(model, world, mesh, shard_placement_fn=expert_dim1, divide_by_world=True):
    for block in model.blocks:
        experts = fully_shard(block.moe.experts, mesh=mesh["dp"],
                              shard_placement_fn=shard_placement_fn)
        if divide_by_world:  # its gradients summed the tokens of the whole EP group
            experts.set_gradient_divide_factor(float(world.size()))  # fault-point: divide-factor
            experts.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        fully_shard(block, mesh=world)  # attention, norms, router: every rank
    return fully_shard(model, mesh=world)


def split_params(model):
    experts = {id(p) for block in model.blocks for p in block.moe.experts.parameters()}
    params = list(model.parameters())
    return ([p for p in params if id(p) not in experts], [p for p in params if id(p) in experts])


def clip_across_meshes(model, max_norm: float, ep_group) -> torch.Tensor:
    dense, experts = split_params(model)
    dense_sq = get_total_norm([p.grad for p in dense]).full_tensor() ** 2
    expert_sq = get_total_norm([p.grad for p in experts]).full_tensor() ** 2  # my experts
    # + the other EP ranks' experts
    dist.all_reduce(expert_sq, group=ep_group)  # fault-point: ep-all-reduce
    total = (dense_sq + expert_sq).sqrt()
    for params in (dense, experts):
        clip_grads_with_norm_(params, max_norm, total)
    return total


# %%
# The run
# -------
# One job on 4 ranks: SGD and AdamW training, a run without the divide factor, the default
# ``Shard(0)`` placement, and a clipped run that first tries torch's ``clip_grad_norm_``. Rank
# ``r`` is at ``(dp, ep) = (r // ep, r % ep)``; the references are one process with every expert.
import inspect

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

import guide
from guide import checks, plotting, report
from guide.data import rank_slice, synthetic_batches
from guide.experts import (build_moe_model, expected_expert_layout, expert_slice,
                           merge_expert_states, mesh_mismatch, to_expert_parallel)
from guide.layout import chunk_rows, full_state, param_layouts
from guide.model import ModelConfig
from guide.training import make_optimizer, mean_over_ranks, next_token_loss

try:  # torch 2.13: shard_placement_fn may name a parameter's mesh too (private classes)
    from torch.distributed.fsdp._fully_shard._fsdp_common import (FSDPMeshInfo,
                                                                  ShardPlacementResult)
except ImportError:
    ShardPlacementResult = None

if "shard_placement_fn" not in inspect.signature(fully_shard).parameters:
    raise RuntimeError("this torch's fully_shard has no shard_placement_fn (torch >= 2.6 has it); "
                       "upgrade torch to run this page.")

PAGE = guide.Page(section="Beyond data parallel", order=3, key_api="shard_placement_fn=",
                  world_size=4, supports=(4, 8),
                  why="a (dp, ep) mesh with ep = 2 and dp >= 2: an even N >= 4")
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
EP = 2
DP = WORLD_SIZE // EP
N_EXPERTS, TOP_K = 6, 2
STEPS, SEQ, BATCH = 4, 8, 8
MAX_NORM = 0.5
CFG = ModelConfig(vocab=64, d_model=32, n_layers=2, n_heads=4, d_mlp=64, max_seq=SEQ)
BATCHES = synthetic_batches(steps=STEPS, batch_size=BATCH, seq_len=SEQ, vocab=CFG.vocab, seed=0)
SETUP = dict(model=repr(CFG), world_size=WORLD_SIZE, dp=DP, ep=EP, n_experts=N_EXPERTS,
             top_k=TOP_K, local_experts=N_EXPERTS // EP)


def shard_moe_one_group(model, world, mesh):
    """Section 5: one ``fully_shard`` per block, its experts put on ``mesh["dp"]`` by
    ``shard_placement_fn`` (torch 2.13's ``ShardPlacementResult``)."""
    experts_dp = FSDPMeshInfo(mesh["dp"], shard_mesh_dim=0)

    def placement(param):
        return ShardPlacementResult(Shard(1), experts_dp) if param.dim() == 3 else None

    for block in model.blocks:
        unit = fully_shard(block, mesh=world, shard_placement_fn=placement)
        unit.set_gradient_divide_factor(float(world.size()))  # the experts need it, as above
        unit.set_force_sum_reduction_for_comms(True)
    return fully_shard(model, mesh=world)


def train(model, opt, rank: guide.Rank | None, clip=None) -> tuple[list[float], list[float]]:
    losses, norms = [], []
    for batch in BATCHES:
        opt.zero_grad(set_to_none=True)
        tokens = batch if rank is None else rank_slice(batch, rank.rank, rank.world_size)
        loss = next_token_loss(model, tokens.to("cpu" if rank is None else rank.device))
        loss.backward()
        if clip is not None:
            norms.append(float(clip(model)))
        opt.step()
        losses.append(loss.item())
    return losses, norms


def all_runs(rank: guide.Rank) -> dict:
    world, mesh = meshes(rank.world_size, EP, rank.device.type)
    ep = mesh["ep"]

    def model(**kw):
        local = to_expert_parallel(build_moe_model(CFG, N_EXPERTS, TOP_K, device=rank.device),
                                   ep.get_group(), ep.get_local_rank(), EP)
        return shard_moe(local, world, mesh, **kw)

    out = {"dp_rank": mesh["dp"].get_local_rank(), "ep_rank": ep.get_local_rank()}
    for opt_name in ("sgd", "adamw"):
        m = model()
        losses, _ = train(m, make_optimizer(opt_name, m.parameters()), rank)
        out[opt_name] = {"losses": losses, "params": full_state(m)}
        if opt_name == "sgd":
            out["layouts"] = param_layouts(m, rank.rank)
            out["meshes"] = {n: tuple(p.device_mesh.mesh.flatten().tolist())
                             for n, p in m.named_parameters()}
    out["default_layouts"] = param_layouts(model(shard_placement_fn=None), rank.rank)
    for name, kw in (("fault", dict(divide_by_world=False)), ("fixed", {})):
        m = model(**kw)  # the first backward's expert and dense gradient norms
        next_token_loss(m, rank_slice(BATCHES[0], rank.rank, rank.world_size)).backward()
        dense, experts = split_params(m)
        sq = get_total_norm([p.grad for p in experts]).full_tensor() ** 2
        dist.all_reduce(sq, group=ep.get_group())
        out[name] = (get_total_norm([p.grad for p in dense]).full_tensor().item(),
                     sq.sqrt().item())
    m = model()
    opt = make_optimizer("sgd", m.parameters())
    naive = []

    def clip(mod):
        if not naive:  # torch's clip, once: it stacks per-parameter norms from both meshes
            try:
                torch.nn.utils.clip_grad_norm_(mod.parameters(), MAX_NORM)
                out["torch_error"] = None
            except (RuntimeError, ValueError, NotImplementedError) as e:
                out["torch_error"] = f"{type(e).__name__}: {e}"
        by_mesh = {}  # one norm per mesh, combined, without the other EP ranks' experts
        for p in mod.parameters():
            by_mesh.setdefault(p.device_mesh, []).append(p.grad)
        naive.append(torch.stack([get_total_norm(g).full_tensor() for g in by_mesh.values()])
                     .norm().item())
        return clip_across_meshes(mod, MAX_NORM, ep.get_group())

    losses, norms = train(m, opt, rank, clip)
    out["clipped"] = {"losses": losses, "norms": norms, "naive": naive, "params": full_state(m)}
    if ShardPlacementResult is not None:
        m = shard_moe_one_group(to_expert_parallel(
            build_moe_model(CFG, N_EXPERTS, TOP_K, device=rank.device), ep.get_group(),
            ep.get_local_rank(), EP), world, mesh)
        losses, _ = train(m, make_optimizer("sgd", m.parameters()), rank)
        out["one_group"] = {"losses": losses, "params": full_state(m),
                            "layouts": param_layouts(m, rank.rank),
                            "meshes": {n: tuple(p.device_mesh.mesh.flatten().tolist())
                                       for n, p in m.named_parameters()}}
    return out


results = guide.launch(all_runs, WORLD_SIZE)


def merged(key: str) -> dict:
    """The full state from the dp-rank-0 rank of each EP rank: its experts, in EP order."""
    lead = {r["ep_rank"]: r for r in results if r["dp_rank"] == 0}
    return merge_expert_states([lead[j][key]["params"] for j in range(EP)], EXPERT_NAMES)


def reference(optimizer: str, clip: bool = False):
    model = build_moe_model(CFG, N_EXPERTS, TOP_K)
    opt = make_optimizer(optimizer, model.parameters())
    losses, norms = train(model, opt, None, (lambda m: torch.nn.utils.clip_grad_norm_(
        m.parameters(), MAX_NORM)) if clip else None)
    with torch.no_grad():  # it must learn: the first batch's loss falls
        after = next_token_loss(model, BATCHES[0]).item()
    checks.assert_learns(f"reference, {optimizer}", [losses[0], after])
    return losses, norms, full_state(model)


shapes = build_moe_model(CFG, N_EXPERTS, TOP_K)
EXPERT_NAMES = {n for n, p in shapes.named_parameters() if p.dim() == 3}
REFERENCE = {opt: reference(opt) for opt in ("sgd", "adamw")}

# %%
# 1. Where every parameter lives
# ------------------------------
# From the shapes alone: a dense parameter is ``(Shard(dim=0),)`` on all ranks, with the
# ``torch.chunk`` rows of dim 0 (:func:`guide.layout.chunk_rows`); an expert weight is this EP
# rank's slice of the experts, ``(Shard(dim=1),)`` on the ranks with the same ``ep`` coordinate,
# with the chunk rows of dim 1 (:func:`guide.experts.expected_expert_layout`). Every rank's
# parameters must match, mesh included; and without ``shard_placement_fn`` the experts' dim 0 is
# split unevenly.
N_PARAMS = PAGE.state("experts.model.params", sum(p.numel() for p in shapes.parameters()),
                      "parameters", model=repr(CFG), n_experts=N_EXPERTS)
ep_shape = {n: (len(range(N_EXPERTS)[expert_slice(N_EXPERTS, 0, EP)]), *p.shape[1:])
            for n, p in shapes.named_parameters() if n in EXPERT_NAMES}


def expected(name: str, p: torch.Tensor, r: dict, rank: int, dim: int) -> tuple:
    if name in EXPERT_NAMES:
        return (*expected_expert_layout(ep_shape[name], dim, r["dp_rank"], DP),
                tuple(q for q in range(WORLD_SIZE) if q % EP == r["ep_rank"]))
    return ("(Shard(dim=0),)", (chunk_rows(p.shape[0], rank, WORLD_SIZE), *p.shape[1:]),
            tuple(range(WORLD_SIZE)))


mismatches, uneven = [], []
for i, r in enumerate(results):
    for lay in r["layouts"]:
        want = expected(lay.name, shapes.get_parameter(lay.name), r, i, 1)
        if (lay.placements, lay.local_shape, r["meshes"][lay.name]) != want:
            mismatches.append((lay.rank, lay.name, lay.placements, lay.local_shape, want))
    for lay in r["default_layouts"]:
        want = expected(lay.name, shapes.get_parameter(lay.name), r, i, 0)
        if (lay.placements, lay.local_shape) != want[:2]:
            uneven.append((lay.rank, lay.name, lay.placements, lay.local_shape, want))
checks.expect("placements", f"({DP}, {EP}) mesh, Shard(1) experts", not mismatches,
              f"rank, name, placements, local shape, expected: {mismatches[:3]}")
checks.expect("placements", "default Shard(0) experts", not uneven,
              f"rank, name, placements, local shape, expected: {uneven[:3]}")

rows = []
for i, r in enumerate(results):
    lay = {x.name: x for x in r["layouts"]}
    default = {x.name: x for x in r["default_layouts"]}
    for n in ("blocks.0.moe.router.weight", "blocks.0.moe.experts.w1", "blocks.0.moe.experts.w2"):
        rows.append([f"rank {i}", n, str(tuple(shapes.get_parameter(n).shape)),
                     str(r["meshes"][n]), lay[n].placements, str(lay[n].local_shape),
                     str(default[n].local_shape) if n in EXPERT_NAMES else "same"])
# Placements, meshes and shapes are text: the two "placements" checks above compared each with
# the formula; the table states them as they are.
PAGE.show(None, rows, ["rank", "parameter", "global", "mesh ranks", "placements", "local",
                       "local, Shard(0)"],
          title=f"{N_PARAMS:,} parameters: every rank's mesh, placement and shape as the formula "
                "says")

# %%
# 2. Training equals one process
# ------------------------------
# The global loss (the mean of the ranks' losses) and the final parameters, the experts gathered
# from one rank per EP coordinate, must match one process with every expert on the full batch.
train_rows = []
for opt in ("sgd", "adamw"):
    ref_losses, _, ref_params = REFERENCE[opt]
    run = f"FSDP2 + EP, {opt}"
    train_rows.append([
        opt,
        PAGE.check(f"experts.train.{opt}.max_dloss", checks.assert_losses_match(
            run, ref_losses, mean_over_ranks([r[opt]["losses"] for r in results]),
            against=checks.SINGLE_PROCESS), fmt=".1e", steps=STEPS, **SETUP),
        PAGE.state("tolerance.loss", checks.LOSS_TOL, "nats"),
        PAGE.check(f"experts.train.{opt}.max_dparam", checks.assert_params_match(
            run, ref_params, merged(opt), checks.PARAM_TOL[opt], against=checks.SINGLE_PROCESS),
            fmt=".1e", steps=STEPS, **SETUP),
        PAGE.state(f"tolerance.param.{opt}", checks.PARAM_TOL[opt], "absolute")])
# Each number cell is a named claim above (the verdict cites them), so the table records nothing
# more.
report.show(report.table(
    train_rows, ["optimizer", "max |Δloss|", "loss tol", "max |Δparam|", "param tol"],
    formats={c: ".1e" for c in ("max |Δloss|", "loss tol", "max |Δparam|", "param tol")}))

# %%
# 3. The divide factor the experts need
# -------------------------------------
# FSDP2 averages a gradient over the ranks of its mesh: the experts' mesh has ``dp`` ranks. But an
# expert's gradient on a rank already sums the tokens the all-to-all brought from every rank of its
# EP group, each with its own rank's mean loss: averaged over ``dp`` only it is ``ep`` times the
# gradient of the global mean loss. ``set_gradient_divide_factor(world size)`` divides by all the
# ranks instead. The first backward's gradient norms, without and with it, against one process
# (dense parts are unaffected):
ref = build_moe_model(CFG, N_EXPERTS, TOP_K)
next_token_loss(ref, BATCHES[0]).backward()
ref_dense, ref_experts = (get_total_norm([p.grad for p in ps]).item() for ps in split_params(ref))
FAULT = dict(SETUP, batch="first")
fault_rows = []
for name, label in (("fault", "fully_shard(experts) alone"),
                    ("fixed", "+ set_gradient_divide_factor")):
    dense, experts = results[0][name]
    checks.expect_close("dense gradient", label, dense, ref_dense, 1e-5, "norm")
    fault_rows.append([label, ref_experts, experts,
                       checks.expect_close("expert gradient", label, experts / ref_experts,
                                           EP if name == "fault" else 1.0, 1e-5,
                                           "norm over the reference's", unit="x",
                                           against=f"{EP if name == 'fault' else 1} x one "
                                                   "process's expert gradient norm")])
PAGE.show("experts.divide", fault_rows,
          ["experts sharded with", "one process", "FSDP2 + EP", "ratio"],
          formats={"one process": ".5f", "FSDP2 + EP": ".5f", "ratio": ".3f"},
          title="Expert gradient norm, first batch", keys=["fault", "fixed"], **FAULT)
PAGE.check("experts.fault.grad_ratio", fault_rows[0][3], "x", fmt=".3f", **FAULT)

# %%
# 4. Clipping across meshes
# -------------------------
# ``clip_grad_norm_`` stacks one norm per parameter, and the experts' norms live on the
# ``dp`` sub-mesh while the others live on all ranks: torch refuses (its message below). One norm
# per mesh combined (as for TP + FSDP2) still misses the experts of the other EP ranks, which no
# DTensor on this rank knows about: too small, and different on each EP rank.
# ``clip_across_meshes`` adds them with an ``all_reduce`` over the EP group. The clipped run must
# match one process's ``clip_grad_norm_`` in norms, losses and parameters.
errors = [r["torch_error"] for r in results]
checks.expect("clip_grad_norm_ across meshes", "torch", all(map(mesh_mismatch, errors)),
              f"torch said {errors[0]!r}")
first = errors[0].splitlines()[0]
print(f"torch, clip_grad_norm_(model.parameters(), {MAX_NORM}):\n  "
      + (first if len(first) <= 200 else first[:200] + " ..."))
clip_losses, clip_norms, clip_params = reference("sgd", clip=True)
checks.expect("clipping happens", "reference", min(clip_norms) > MAX_NORM,
              f"norms {clip_norms} not all above max_norm {MAX_NORM}")
CLIP = dict(SETUP, optimizer="sgd", max_norm=MAX_NORM, steps=STEPS)
run = "clip_across_meshes"
norm_gap = max(checks.expect_close("clip norm", f"rank {i}", r["clipped"]["norms"], clip_norms,
                                   checks.LOSS_TOL, "norm", unit="L2",
                                   against="one process's clip_grad_norm_")
               for i, r in enumerate(results))
clip_rows = [
    ["max |norm − one process|", PAGE.check("experts.clip.norm_gap", norm_gap, fmt=".1e",
                                            **CLIP), checks.LOSS_TOL],
    ["max |Δloss|", PAGE.check("experts.clip.max_dloss", checks.assert_losses_match(
        run, clip_losses, mean_over_ranks([r["clipped"]["losses"] for r in results]),
        against=checks.SINGLE_PROCESS), fmt=".1e", **CLIP), checks.LOSS_TOL],
    ["max |Δparam|", PAGE.check("experts.clip.max_dparam", checks.assert_params_match(
        run, clip_params, merged("clipped"), checks.PARAM_TOL["sgd"],
        against=checks.SINGLE_PROCESS), fmt=".1e", **CLIP), checks.PARAM_TOL["sgd"]]]
# Each measured cell is a named claim above; the table records nothing more.
report.show(report.table(clip_rows, ["clipped SGD", "measured", "tol"],
                         formats={"measured": ".1e", "tol": ".0e"}))
naive_rows = [["one process", clip_norms[0]]]
for i, r in enumerate(results):
    naive_rows.append([f"per mesh, rank {i}", checks.expect_order(
        "per-mesh norm misses experts", f"rank {i}", r["clipped"]["naive"][0], clip_norms[0],
        low_name="per-mesh norm", high_name="the true norm", unit="L2")])
PAGE.show("experts.naive", naive_rows, ["first-step gradient norm", "L2"], formats={"L2": ".5f"},
          keys=["reference", *(f"rank{i}" for i in range(WORLD_SIZE))],
          **dict(CLIP, batch="first"))

# The figure divides every norm by one process's at the same step: the fix sits on 1, the
# per-mesh norms below it, each EP rank missing a different set of experts.
plotting.style()
fig, ax = plt.subplots(figsize=(7.5, 4.2))
ax.axhline(1.0, color=plotting.REFERENCE_COLOR, lw=5, alpha=0.3, label="one process")
ax.plot([n / c for n, c in zip(results[0]["clipped"]["norms"], clip_norms)], "--",
        color="#1f77b4", lw=1.8, marker="o", label="clip_across_meshes")
for i in range(EP):
    ax.plot([n / c for n, c in zip(results[i]["clipped"]["naive"], clip_norms)], ":",
            marker=".", color=("#9467bd", "#ff7f0e")[i], label=f"one norm per mesh, EP rank {i}")
ax.set(xlabel="training step", ylabel="gradient norm / one process's (ratio)",
       title="Without the other EP ranks' experts the norm is too small")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
plotting.legend_below(fig)
plt.show()

# %%
# 5. One ``fully_shard`` with two meshes (torch 2.13)
# ---------------------------------------------------
# In torch 2.13 ``shard_placement_fn`` may also return a ``ShardPlacementResult``, a placement
# and an ``FSDPMeshInfo``: parameters of one ``fully_shard`` group on different meshes, the MoE
# case of its docstring (``shard_moe_one_group`` above). Both classes are private
# (``torch.distributed.fsdp._fully_shard._fsdp_common``) and older releases accept only
# ``Shard`` or ``None``, so the code to copy keeps two public groups. Where torch has them, the
# one-group model must place every parameter as section 1's formula says and train as one process;
# the experts still need the world size as divide factor.
if ShardPlacementResult is None:
    print("this torch's shard_placement_fn returns only Shard or None: section 5 needs torch 2.13")
else:
    bad = [(lay.rank, lay.name) for i, r in enumerate(results) for lay in r["one_group"]["layouts"]
           if (lay.placements, lay.local_shape, r["one_group"]["meshes"][lay.name])
           != expected(lay.name, shapes.get_parameter(lay.name), r, i, 1)]
    checks.expect("placements", "one group, ShardPlacementResult", not bad,
                  f"rank, name not as the formula: {bad[:3]}")
    ref_losses, _, ref_params = REFERENCE["sgd"]
    run = "one fully_shard, ShardPlacementResult, sgd"
    one = [PAGE.check("experts.one_group.max_dloss", checks.assert_losses_match(
               run, ref_losses, mean_over_ranks([r["one_group"]["losses"] for r in results]),
               against=checks.SINGLE_PROCESS), fmt=".1e", steps=STEPS, **SETUP),
           PAGE.check("experts.one_group.max_dparam", checks.assert_params_match(
               run, ref_params, merged("one_group"), checks.PARAM_TOL["sgd"],
               against=checks.SINGLE_PROCESS), fmt=".1e", steps=STEPS, **SETUP)]
    print("one fully_shard per block, experts on mesh['dp'] by ShardPlacementResult:\n"
          f"  every parameter as the formula says; SGD against one process: "
          f"max |Δloss| {one[0]:.1e}, max |Δparam| {one[1]:.1e}")
PAGE.conclude(
    f"All checks passed: on a ({DP}, {EP}) mesh every parameter sits where the formula says, "
    f"FSDP2 + EP trains as one process (max |Δloss| {train_rows[0][1]:.1e} SGD, "
    f"{train_rows[1][1]:.1e} AdamW), the experts need the world size as divide factor "
    f"(ratio {float(fault_rows[0][3]):.3f} without it), and clip_across_meshes clips as one "
    f"process (norm gap {clip_rows[0][1]:.1e}).")
# sphinx_gallery_thumbnail_number = 1
# sphinx_gallery_start_ignore
# What the tests (tests/test_experts_mesh.py) read of this run, and nothing else.
RESULT = dict(results=results, shapes=shapes, expected=expected, EXPERT_NAMES=EXPERT_NAMES,
              clip_norms=clip_norms, ShardPlacementResult=ShardPlacementResult)
# sphinx_gallery_end_ignore
