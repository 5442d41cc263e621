"""
Tensor parallel + FSDP2 on a 2-D mesh
=====================================

.. admonition:: Verdict
   :class: tip

   Add tensor parallelism (TP) inside a node only when FSDP2 alone runs out of batch or of
   activation memory: estimated for llama-3-70b at the sequence length of section 6, TP 8 cuts
   activations per GPU
   from :claim:`tp-fsdp2.estimate.llama-3-70b.tp1.activations_gib` to
   :claim:`tp-fsdp2.estimate.llama-3-70b.tp8.activations_gib` GiB for
   :claim:`tp-fsdp2.estimate.llama-3-70b.tp8.tp_all_reduce_mib` MiB of all-reduce per layer.
   Pass ``mesh["dp"]`` to ``fully_shard``: rank 0 then holds
   :claim:`tp-fsdp2.state.rank0.of_one_process` of the model state, the whole mesh (HSDP)
   :claim:`tp-fsdp2.state.whole_mesh.of_one_process`. Clip per mesh (section 5).

Measured on CPU gloo processes (tiny models, two shared cores); the GPU numbers of section 6 are
predicted and labelled so.

Each block's attention and MLP are split over the ``"tp"`` dimension of a ``(dp, tp)`` mesh
(``ColwiseParallel`` then ``RowwiseParallel``, Megatron-style) and FSDP2 shards what each TP rank
holds over ``"dp"``. This page runs it on 4 CPU gloo ranks as ``(2, 2)`` and fails the build unless
every parameter sits where the plan says, each rank holds the model state the plan predicts,
training equals one process, and each step issues exactly the collectives the model lists in each
mesh dimension. Then three pitfalls, each reproduced and fixed, and an estimate of when the second
dimension pays on real models.
"""

# %%
# The code to copy
# ----------------
# The plan names each block's linear layers (:class:`guide.tensor_parallel.TPBlock`: the site's
# block with separate ``q``, ``k``, ``v``, so that a column split is a split of the heads).
# ``parallelize_module`` turns them into ``DTensor`` s on ``mesh["tp"]``; ``fully_shard`` then
# shards each TP shard over ``mesh["dp"]``. A TP group shares its data: a rank takes the
# batch slice of its ``dp`` coordinate. ``clip_by_mesh`` is ``clip_grad_norm_`` for a model whose
# parameters live on two meshes (section 4 shows why it is needed).
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

PLAN = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
        "proj": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def shard_2d(model, dp: int, tp: int, device_type: str = "cpu"):
    mesh = init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], PLAN)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model, mesh


def clip_by_mesh(params, max_norm: float) -> torch.Tensor:
    by_mesh = {}
    for p in params:
        if p.grad is not None:
            by_mesh.setdefault(p.device_mesh, []).append(p)
    norms = [get_total_norm([p.grad for p in ps]).full_tensor() for ps in by_mesh.values()]
    total = torch.linalg.vector_norm(torch.stack(norms))
    for ps in by_mesh.values():
        clip_grads_with_norm_(ps, max_norm, total)
    return total


def train_step(model, opt, tokens: torch.Tensor) -> float:
    opt.zero_grad()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    opt.step()
    return loss.item()


# %%
# The run
# -------
# One job on 4 ranks (``torchrun --nproc-per-node=8`` makes the mesh ``(4, 2)``): SGD and AdamW
# training runs, the second step onwards counted by :class:`guide.comm.tp.MeshLog` (every
# collective with the ranks of its group: FSDP2's ``torch.distributed`` calls and the functional
# collectives DTensor issues for TP) and, as a cross-check, by :class:`guide.comm.CollectiveLog`
# (which sees FSDP2's calls only); then the pitfalls.
import matplotlib.pyplot as plt

import guide
from guide import checks, plotting, report
from guide.comm import CollectiveLog, ring_bytes
from guide.comm.tp import MeshLog, tp_fsdp2_step, tp_fsdp_estimate, tp_step
from guide.data import synthetic_batches
from guide.layout import full_state, param_layouts
from guide.memory import PRESETS, GiB, measure, state_bytes_by_rank
from guide.model import ModelConfig
from guide.tensor_parallel import build_tp_model, expected_layout, plan_kinds, tp_local_shapes
from guide.training import make_optimizer, mean_over_ranks

PAGE = guide.Page(section="Beyond data parallel", order=1, key_api="parallelize_module(",
                  world_size=4, supports=(4, 8),
                  why="a (dp, tp) mesh with tp = 2 and dp >= 2: an even N >= 4")
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
TP = 2
DP = WORLD_SIZE // TP
STEPS, SEQ, PER_DP = 4, 8, 2  # PER_DP sequences per data-parallel rank
CFG = ModelConfig(vocab=64, d_model=32, n_layers=2, n_heads=4, d_mlp=64, max_seq=SEQ)
BATCHES = synthetic_batches(steps=STEPS, batch_size=PER_DP * DP, seq_len=SEQ,
                            vocab=CFG.vocab, seed=0)
MAX_NORM = 0.5
SETUP = dict(model=repr(CFG), world_size=WORLD_SIZE, dp=DP, tp=TP)


def mine(batch: torch.Tensor, dp_rank: int) -> torch.Tensor:
    return batch.chunk(DP)[dp_rank]  # the TP group's slice: its dp coordinate's


def training_run(rank: guide.Rank, optimizer: str) -> dict:
    model, mesh = shard_2d(build_tp_model(CFG, device=rank.device), DP, TP, rank.device.type)
    dp_rank = mesh["dp"].get_local_rank()
    opt = make_optimizer(optimizer, model.parameters())
    losses = [train_step(model, opt, mine(BATCHES[0], dp_rank).to(rank.device))]
    with CollectiveLog(model) as c10d, MeshLog() as log:
        losses += [train_step(model, opt, mine(b, dp_rank).to(rank.device))
                   for b in BATCHES[1:]]
    return {"losses": losses, "params": full_state(model), "state": measure(model, opt),
            "layouts": param_layouts(model, rank.rank), "dp_rank": dp_rank,
            "by_dim": log.by_dim(mesh), "c10d": c10d.records}


def first_backward(model, dp_rank: int, device) -> None:
    tokens = mine(BATCHES[0], dp_rank).to(device)
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()


def clip_run(rank: guide.Rank) -> dict:
    """Pitfalls 2 and 3: a norm from to_local(), clip_grad_norm_ across meshes, the fix."""
    model, mesh = shard_2d(build_tp_model(CFG, device=rank.device), DP, TP, rank.device.type)
    first_backward(model, mesh["dp"].get_local_rank(), rank.device)
    grads = [p.grad for p in model.parameters()]
    local = torch.linalg.vector_norm(torch.stack([g.to_local().norm() for g in grads]))
    try:
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        error = None
    except RuntimeError as e:
        error = str(e)
    total = clip_by_mesh(model.parameters(), MAX_NORM)
    return {"local_norm": local.item(), "total": total.item(), "error": error,
            "grads": {n: p.grad.full_tensor() for n, p in model.named_parameters()}}


def whole_mesh_run(rank: guide.Rank) -> dict:
    """Pitfall 1: the 2-D mesh given to fully_shard, after TP and without it."""
    mesh = init_device_mesh(rank.device.type, (DP, TP), mesh_dim_names=("dp", "tp"))
    model = build_tp_model(CFG, device=rank.device)
    try:
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], PLAN)
            fully_shard(block, mesh=mesh)  # the whole mesh: the mistake
        error = None
    except RuntimeError as e:
        error = str(e)
    model = build_tp_model(CFG, device=rank.device)  # no TP: fully_shard makes it HSDP
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = make_optimizer("adamw", model.parameters())
    train_step(model, opt, mine(BATCHES[0], mesh["dp"].get_local_rank()).to(rank.device))
    return {"error": error, "layouts": param_layouts(model, rank.rank),
            "state": measure(model, opt)}


def all_runs(rank: guide.Rank) -> dict:
    return {"sgd": training_run(rank, "sgd"), "adamw": training_run(rank, "adamw"),
            "clip": clip_run(rank), "whole_mesh": whole_mesh_run(rank)}


per_rank = guide.launch(all_runs, WORLD_SIZE)
runs = {k: [r[k] for r in per_rank] for k in per_rank[0]}


def reference(optimizer: str) -> tuple[list[float], dict]:
    """One process, the full batch; it must learn (the first batch's loss falls)."""
    model = build_tp_model(CFG)
    opt = make_optimizer(optimizer, model.parameters())
    losses = [train_step(model, opt, b) for b in BATCHES]
    with torch.no_grad():
        after = F.cross_entropy(model(BATCHES[0][:, :-1]).flatten(0, 1),
                                BATCHES[0][:, 1:].flatten()).item()
    checks.assert_learns(f"reference, {optimizer}", [losses[0], after])
    return losses, full_state(model)


REFERENCE = {opt: reference(opt) for opt in ("sgd", "adamw")}

# %%
# 1. Where every parameter lives
# ------------------------------
# :func:`guide.tensor_parallel.expected_layout` derives each parameter's placements and local
# shape from the plan alone: a colwise weight ``(_StridedShard(dim=0, sf=2), Shard(dim=0))`` (FSDP2
# shards dim 0 again inside TP's shard of dim 0), a rowwise weight ``(Shard(dim=0),
# Shard(dim=1))``, a rowwise bias ``(Shard(dim=0), Replicate())``; norms, embeddings and the head,
# outside the plan, stay on the 1-D dp mesh. Every rank's report must match it.
shapes_model = build_tp_model(CFG)
N_PARAMS = PAGE.state("tp-fsdp2.model.params",
                      sum(p.numel() for p in shapes_model.parameters()), "parameters",
                      model=repr(CFG))
mismatches = []
for result in runs["sgd"]:
    want = expected_layout(shapes_model, PLAN, DP, TP, result["dp_rank"])
    mismatches += [(lay.rank, lay.name, lay.placements, lay.local_shape, want[lay.name])
                   for lay in result["layouts"]
                   if (lay.placements, lay.local_shape) != want[lay.name]]
checks.expect("2-D placements", f"({DP}, {TP}) mesh", not mismatches,
              f"rank, name, placements, local shape, expected: {mismatches[:3]}")
layout0 = {lay.name: lay for lay in runs["sgd"][0]["layouts"]}
shown = ["blocks.0.q.weight", "blocks.0.proj.weight", "blocks.0.proj.bias",
         "blocks.0.fc1.bias", "blocks.0.ln1.weight", "tok_emb.weight"]
LAYOUT = dict(SETUP, rank=0)
# Placements and shapes are text, not numbers: the "2-D placements" check above compared every
# rank's with expected_layout's; the ledger states them as computed.
report.show(report.table(
    [[n, str(layout0[n].global_shape),
      PAGE.state(f"tp-fsdp2.layout.{n}.placements", layout0[n].placements, "placements",
                 **LAYOUT),
      PAGE.state(f"tp-fsdp2.layout.{n}.local_shape", str(layout0[n].local_shape), "shape",
                 **LAYOUT)] for n in shown],
    ["parameter", "global", "placements (dp, tp)", "rank 0 local"],
    title=f"{N_PARAMS:,} parameters on a ({DP}, {TP}) mesh: every rank as predicted"))

# %%
# 2. Memory: the TP shard, sharded again
# --------------------------------------
# A rank holds FSDP2's share over ``dp`` ranks of its TP-local tensors: the model is
# :func:`guide.memory.state_bytes_by_rank` (``"fsdp2"``, ``dp`` ranks) of
# :func:`guide.tensor_parallel.tp_local_shapes`. Split weights come to 1/4 of the model on every
# rank; the parts outside the plan (embeddings, norms, head, rowwise biases) only to 1/2.
local_shapes = tp_local_shapes(shapes_model, PLAN, TP)
ADAMW = ("fp32", "adamw")
full = state_bytes_by_rank([tuple(p.shape) for p in shapes_model.parameters()], "ddp", 1,
                           *ADAMW, ddp_buckets=False)[0].model_state
predicted = state_bytes_by_rank(list(local_shapes.values()), "fsdp2", DP, *ADAMW,
                                ddp_buckets=False)
for r, result in enumerate(runs["adamw"]):
    got, want = result["state"], predicted[result["dp_rank"]]
    checks.expect("2-D memory", f"rank {r}", got == want, f"measured {got}, model {want}")
MEM = dict(SETUP, optimizer="adamw", precision="fp32")
rank0 = checks.expect_close("2-D memory", "rank 0", runs["adamw"][0]["state"].model_state,
                            predicted[runs["adamw"][0]["dp_rank"]].model_state, 0,
                            "model state", unit="bytes",
                            against="state_bytes_by_rank of tp_local_shapes")
# HSDP over the whole mesh: FSDP2 over the tp dimension (rank 0 is its shard 0) of the whole
# model, replicated over dp: the same formula with the full shapes and tp ranks.
hsdp = checks.expect_close("whole mesh is HSDP", "rank 0",
                           runs["whole_mesh"][0]["state"].model_state,
                           state_bytes_by_rank([tuple(p.shape) for p in shapes_model.parameters()],
                                               "fsdp2", TP, *ADAMW,
                                               ddp_buckets=False)[0].model_state,
                           0, "model state", unit="bytes",
                           against=f"FSDP2 over {TP} ranks of the whole model")
checks.expect_order("whole mesh is HSDP", "memory", float(rank0), float(hsdp),
                    low_name="2-D state", high_name="HSDP state")
PAGE.show("tp-fsdp2.state",
          [["one process", full, 1.0],
           [f"TP {TP} x FSDP2 {DP}, rank 0", rank0, rank0.scaled(1 / full, "of one process")],
           ["whole mesh to fully_shard (HSDP), rank 0", hsdp, hsdp.scaled(1 / full, "of one process")]],
          ["AdamW model state", "bytes", "of one process"],
          formats={"bytes": ",.0f", "of one process": ".3f"},
          title="Measured = model on every rank", keys=["full", "rank0", "whole_mesh"], **MEM)

# %%
# 3. Training equals one process
# ------------------------------
# The global loss (mean over the ranks; the two ranks of a TP group compute the same loss) and
# the final parameters must match one process on the full batch within the site's tolerances.
rows = []
for opt in ("sgd", "adamw"):
    ranks, (ref_losses, ref_params) = runs[opt], REFERENCE[opt]
    rows.append([opt,
                 checks.assert_losses_match(f"TP+FSDP2, {opt}", ref_losses,
                                            mean_over_ranks([r["losses"] for r in ranks]),
                                            against=checks.SINGLE_PROCESS),
                 PAGE.state("tolerance.loss", checks.LOSS_TOL, "nats"),
                 checks.assert_params_match(f"TP+FSDP2, {opt}", ref_params, ranks[0]["params"],
                                            checks.PARAM_TOL[opt], against=checks.SINGLE_PROCESS),
                 PAGE.state(f"tolerance.param.{opt}", checks.PARAM_TOL[opt], "absolute")])
PAGE.show("tp-fsdp2.train",
          rows, ["optimizer", "max |Δloss|", "loss tol", "max |Δparam|", "param tol"],
          formats={c: ".1e" for c in ("max |Δloss|", "loss tol", "max |Δparam|", "param tol")},
          steps=STEPS, **SETUP)

# %%
# 4. Collectives per mesh dimension
# ---------------------------------
# In the ``tp`` group: TP's activation all-reduces, one per rowwise output in forward and one per
# colwise input gradient in backward (:func:`guide.comm.tp.tp_step`). In the ``dp`` group:
# FSDP2's all-gathers and reduce-scatters of the TP-local shards (:func:`guide.comm.tp.
# tp_fsdp2_step`). Calls and elements per step must equal the model on every rank, and FSDP2's
# calls, counted again by :class:`guide.comm.CollectiveLog`, must be the dp group's. Note the
# backward: ``q``, ``k`` and ``v`` each all-reduce the gradient of the same input, three calls
# where a fused projection would make one (torchtitan converts the attention's input once, with
# ``PrepareModuleInput`` on the attention module, for the same reason).
TOKENS = PER_DP * SEQ
MODEL = {"tp": tp_step(shapes_model, plan_kinds(PLAN), TOKENS, TP),
         "dp": tp_fsdp2_step(shapes_model, local_shapes, DP)}
volume = {}
for r, result in enumerate(runs["sgd"]):
    for dim, expected in MODEL.items():
        checked = checks.check_volume(f"rank {r}, {dim} group", result["by_dim"][dim], expected,
                                      STEPS - 1, tol=0.0, exact_calls=("all_gather",
                                                                       "reduce_scatter",
                                                                       "all_reduce"))
        if r == 0:
            volume[dim] = {kind: elements for (kind, _), (elements, _, _) in checked.items()}
    checks.expect("dp = FSDP2's calls", f"rank {r}",
                  len(result["c10d"]) == len(result["by_dim"]["dp"]),
                  f"CollectiveLog saw {len(result['c10d'])} calls, the dp group "
                  f"{len(result['by_dim']['dp'])}")
records = runs["sgd"][0]["by_dim"]
COMM = dict(SETUP, tokens_per_rank=TOKENS)
comm_rows = []
for dim in ("tp", "dp"):
    for kind in sorted({c.kind for c in records[dim]}):
        mine_ = [c for c in records[dim] if c.kind == kind]
        model_ = [c for c in MODEL[dim] if c.kind == kind]
        run = f"rank 0, {dim} group, {kind}"
        comm_rows.append([
            f"{dim}: {kind}",
            checks.expect_close("comm calls", run, len(mine_) / (STEPS - 1), len(model_), 0,
                                "calls per step", unit="calls", against="the model's calls"),
            volume[dim][kind],
            checks.expect_close("comm volume", run,
                                sum(ring_bytes(c) for c in mine_) / (STEPS - 1),
                                sum(ring_bytes(c) for c in model_), 1e-9, "ring bytes",
                                rel=True, against="the model's collectives, ring cost"
                                ).scaled(1 / 2**10, "KiB")])
PAGE.show("tp-fsdp2.step",
          comm_rows, ["group: collective", "calls", "elements", "KiB sent (ring)"],
          formats={"calls": ",.0f", "elements": ",.0f", "KiB sent (ring)": ",.2f"},
          title=f"One step on rank 0 = the model ({STEPS - 1} steps counted)",
          **COMM)

fig, ax = plt.subplots(figsize=(7.5, 2.8))
plotting.style()
ax.barh([row[0] for row in comm_rows], [row[3] for row in comm_rows],
        color=["#1f77b4" if row[0].startswith("tp") else "#ff7f0e" for row in comm_rows])
ax.invert_yaxis()
ax.set_xlabel("KiB sent per rank per step (ring model of the counted calls)")
ax.set_title(f"TP {TP} x FSDP2 {DP}: activations cross the tp group, weights the dp group",
             fontsize=10)
plt.show()

# %%
# 5. Pitfalls, reproduced and fixed
# ---------------------------------
# **The whole mesh to** ``fully_shard``. After TP, torch refuses it (the message below). Without
# TP, it is accepted and silently makes HSDP: ``"tp"`` becomes the shard dimension, ``"dp"`` a
# replica dimension, every parameter ``(Replicate(), Shard(dim=0))``, and each rank holds 1/tp of
# the model instead of about 1/(dp x tp) (section 2's table). The fix: ``mesh["dp"]``.
whole = runs["whole_mesh"]
checks.expect("whole mesh after TP",
              "fully_shard", all(r["error"] and "overlapping meshes" in r["error"] for r in whole),
              f"torch said {whole[0]['error']!r}")
checks.expect("whole mesh is HSDP", "placements",
              {lay.placements for r in whole for lay in r["layouts"]}
              == {"(Replicate(), Shard(dim=0))"},
              "some parameter is not (Replicate(), Shard(dim=0))")
print("torch, fully_shard(block, mesh=mesh) after TP:\n  RuntimeError: "
      + whole[0]["error"].splitlines()[0])

# %%
# **A gradient norm from** ``to_local()``. A rank's local tensors are its shards, so the norm of
# them is this rank's part of the norm, not the norm; ``get_total_norm`` on the DTensor gradients
# followed by ``full_tensor()`` is the real one. Both against the single-process norm of the first
# batch's gradients:
ref = build_tp_model(CFG)
F.cross_entropy(ref(BATCHES[0][:, :-1]).flatten(0, 1), BATCHES[0][:, 1:].flatten()).backward()
ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM).item()
ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
clip = runs["clip"]
NORM = dict(SETUP, batch="first")
gap = checks.expect_close("gradient norm", "full_tensor()", [r["total"] for r in clip],
                          [ref_norm] * WORLD_SIZE, 1e-5, "norm")
checks.expect("to_local() norm is wrong",
              "every rank", all(abs(r["local_norm"] - ref_norm) > 100 * 1e-5 for r in clip),
              "a local norm equals the true one")
norm_rows = [["one process", ref_norm],
             ["full_tensor(), every rank",
              checks.expect_close("gradient norm", "full_tensor(), rank 0", clip[0]["total"],
                                  ref_norm, 1e-5, "norm", unit="L2",
                                  against="the single-process norm")],
             *([f"to_local(), rank {r}",
                checks.expect_order("to_local() norm is wrong", f"rank {r}", c["local_norm"],
                                    ref_norm, low_name="to_local() norm",
                                    high_name="the true norm", unit="L2")]
               for r, c in enumerate(clip))]
PAGE.show("tp-fsdp2.norm", norm_rows, ["gradient norm", "L2"], formats={"L2": ".5f"},
          keys=["reference", "full_tensor", *(f"to_local.rank{r}"
                                              for r in range(len(clip)))],
          **NORM)

# %%
# **A parameter outside the TP plan.** The norms, embeddings and head stay on the 1-D dp mesh
# while the split weights live on the 2-D mesh, and ``clip_grad_norm_`` stacks the per-parameter
# norms of both: torch's message is below. ``clip_by_mesh`` (the code to copy) takes one norm per
# mesh, combines them and clips each mesh's gradients with that total; the clipped gradients must
# equal the single-process ``clip_grad_norm_``'s within the SGD parameter tolerance.
checks.expect("clip_grad_norm_ across meshes",
              "torch", all(r["error"] and "same mesh" in r["error"] for r in clip),
              f"torch said {clip[0]['error']!r}")
checks.expect("clipping happens", "reference", ref_norm > MAX_NORM,
              f"norm {ref_norm} <= max_norm {MAX_NORM}")
dgrad = checks.assert_params_match("clip_by_mesh", ref_grads, clip[0]["grads"],
                                   checks.PARAM_TOL["sgd"], check="clipped gradients",
                                   against="one process's clip_grad_norm_")
print(f"torch, clip_grad_norm_(model.parameters(), {MAX_NORM}):\n  RuntimeError: "
      + clip[0]["error"].splitlines()[0])
print(f"clip_by_mesh: clipped gradients = one process's within "
      f"{PAGE.check('tp-fsdp2.clip.grad_gap', dgrad, 'absolute', fmt='.1e', **NORM):.1e}"
      f" (tol {checks.PARAM_TOL['sgd']:.0e}); norm gap "
      f"{PAGE.check('tp-fsdp2.clip.norm_gap', gap, 'L2', fmt='.1e', **NORM):.1e}")

# %%
# 6. When the second dimension pays (an estimate)
# -----------------------------------------------
# Not measured: :func:`guide.comm.tp.tp_fsdp_estimate` for presets on ``GPUS`` GPUs,
# sequences of ``EST_SEQ`` tokens (both in the table's title), one sequence per data-parallel
# rank, 16-bit weights and activations, a fused attention kernel and norm, no activation
# checkpointing and no sequence parallelism: per layer the memory model's per-operation count, its
# two norms whole on every TP rank, attention and MLP split ``t`` ways (the split of Korthikanti et
# al.'s Table 2, applied to the calculator's count; the head's logits left out). With ``t`` GPUs
# of a node sharing one sequence,
# each GPU keeps less of that sequence's activations and gathers 1/t of each layer, and a global
# batch of ``GPUS/t`` sequences is enough to use every GPU; the price is four activation
# all-reduces per layer and step, which only NVLink carries fast enough.
GPUS, EST_SEQ = 1024, 8192
est_rows = []
for preset in ("llama-3-8b", "llama-3-70b", "llama-3.1-405b"):
    for tp in (1, 2, 4, 8):
        e = tp_fsdp_estimate(PRESETS[preset], GPUS, tp, EST_SEQ)
        EST = dict(model=preset, gpus=GPUS, tp=tp, seq_len=EST_SEQ, micro_batch=1,
                   sequence_parallel=False, precision="bf16", checkpointing="none")
        key = f"tp-fsdp2.estimate.{preset}.tp{tp}"
        est_rows.append([preset, tp, PAGE.state(f"{key}.global_batch", e.global_batch,
                                                "sequences", **EST),
                         PAGE.state(f"{key}.activations_gib",
                                    round(e.activation_bytes / GiB, 1), "GiB", **EST),
                         PAGE.state(f"{key}.gathered_layer_mib",
                                    round(e.gathered_layer_bytes / 2**20, 1), "MiB", **EST),
                         PAGE.state(f"{key}.tp_all_reduce_mib",
                                    round(e.tp_all_reduce_bytes / 2**20, 1), "MiB", **EST)])
# Each cell is a named claim above with its own row's assumptions (the tp degree), so the table
# itself records nothing more.
report.show(report.table(
    est_rows, ["preset", "tp", "global batch", "activations/GPU (GiB)", "gathered layer (MiB)",
               "TP all-reduce/layer (MiB)"],
    formats={"activations/GPU (GiB)": ",.1f", "gathered layer (MiB)": ",.1f",
             "TP all-reduce/layer (MiB)": ",.1f"},
    title=f"ESTIMATE: {GPUS} GPUs, {EST_SEQ} tokens, 1 sequence per dp rank"))
print("\nAll checks passed: TP + FSDP2 places, holds, trains and communicates as predicted.")

# sphinx_gallery_thumbnail_number = 1
